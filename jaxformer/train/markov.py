"""A synthetic byte source with an exactly known entropy rate: a sparse random order-k Markov chain.

The chain runs over ``A`` byte values (``32 + i`` — printable — when ``A ≤ 95``, else ``i``).
Each context of the last ``k`` symbols (``A^k`` contexts) has ``branching`` distinct
successors with Dirichlet(``concentration``) probabilities. Documents start from the
stationary distribution π over contexts, so every document is a stationary process and

    entropy rate  H = Σ_c π(c) · H(P(·|c))      (bits per byte)

exactly; that is the lowest loss any model can reach, the ground truth for a fitted
irreducible loss E. The unigram entropy H(μ) of the symbol marginal μ is what a model
that ignores context reaches; ``H ≤ H(μ)``.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from jaxformer.configs import NON_NEGATIVE, POSITIVE, Range, Section, setting

STATIONARY_STEPS, STATIONARY_TOL = 200_000, 1e-15  # power iteration: at most this many steps, to this L1 change


@dataclasses.dataclass(frozen=True)
class MarkovConfig(Section):
    """The ``synthetic-markov`` source: an order-``order`` chain over ``alphabet`` byte values.

    Every context has ``branching`` possible successors with Dirichlet(``concentration``)
    probabilities; ``bytes`` bytes are generated, in independent stationary documents.
    """

    SECTION = "data.markov"

    order: int = setting(1, POSITIVE)
    alphabet: int = setting(32, Range(2, 256))
    branching: int = 4
    concentration: float = setting(1.0, POSITIVE)
    bytes: int = setting(2_000_000, POSITIVE)
    seed: int = setting(0, NON_NEGATIVE)  # numpy's generator takes no negative seed

    def check(self) -> None:
        Range(1, self.alphabet).check("data.markov.branching", self.branching)
        if self.alphabet**self.order > 1 << 22:
            raise ValueError(f"data.markov.order={self.order} with alphabet {self.alphabet} has "
                             f"{self.alphabet**self.order:,} contexts; at most {1 << 22:,} are supported")


@dataclasses.dataclass(frozen=True)
class MarkovSource:
    """``successors[c, j]``: the j-th possible next symbol after context c, with ``probs[c, j]``."""

    order: int
    alphabet: int
    successors: np.ndarray  # [contexts, branching] int (A^k contexts)
    probs: np.ndarray  # [contexts, branching] float64, rows sum to 1

    @property
    def num_contexts(self) -> int:
        return self.alphabet**self.order

    @property
    def byte_values(self) -> np.ndarray:
        """Symbol i is byte ``byte_values[i]``."""
        offset = 32 if self.alphabet <= 95 else 0
        return np.arange(self.alphabet, dtype=np.uint8) + offset

    def _next_contexts(self) -> np.ndarray:
        """``[contexts, branching]``: the context after emitting each successor."""
        shifted = (np.arange(self.num_contexts) * self.alphabet) % self.num_contexts
        return shifted[:, None] + self.successors

    @functools.cached_property
    def stationary(self) -> np.ndarray:
        """π over contexts, by power iteration of the lazy chain (same fixed points, aperiodic), computed once;
        ``ValueError`` when it has not converged after `STATIONARY_STEPS` steps."""
        next_ctx = self._next_contexts().ravel()
        pi = np.full(self.num_contexts, 1.0 / self.num_contexts)
        for _ in range(STATIONARY_STEPS):
            moved = np.bincount(next_ctx, weights=(pi[:, None] * self.probs).ravel(), minlength=self.num_contexts)
            new = 0.5 * (pi + moved)
            if np.abs(new - pi).sum() < STATIONARY_TOL:
                return new / new.sum()
            pi = new
        raise ValueError(f"the chain's stationary distribution did not converge in {STATIONARY_STEPS:,} steps: it "
                         "mixes too slowly (transitions of near-zero probability between its parts)")

    def entropy_rate_bits(self) -> float:
        """Σ_c π(c) H(P(·|c)) in bits per symbol (= per byte)."""
        return float(self.stationary @ _entropy_bits(self.probs))

    def unigram_entropy_bits(self) -> float:
        """Entropy of the stationary symbol marginal, in bits per byte."""
        last_symbol = np.arange(self.num_contexts) % self.alphabet
        marginal = np.bincount(last_symbol, weights=self.stationary, minlength=self.alphabet)
        return float(_entropy_bits(marginal[None])[0])

    def sample(self, num_documents: int, length: int, seed: int) -> list[bytes]:
        """``num_documents`` independent stationary documents of ``length`` bytes each."""
        rng = np.random.default_rng(seed)
        context = rng.choice(self.num_contexts, size=num_documents, p=self.stationary)
        out = np.empty((num_documents, length), dtype=np.int64)
        # the first k symbols of a document are its starting context, most significant first
        for i in range(min(self.order, length)):
            out[:, i] = (context // self.alphabet ** (self.order - 1 - i)) % self.alphabet
        cumulative = np.cumsum(self.probs, axis=1)
        for t in range(self.order, length):
            choice = (cumulative[context] < rng.random(num_documents)[:, None]).sum(axis=1)
            choice = np.minimum(choice, self.successors.shape[1] - 1)  # guards u ≥ the float sum
            symbol = self.successors[context, choice]
            out[:, t] = symbol
            context = (context * self.alphabet) % self.num_contexts + symbol
        values = self.byte_values[out]
        return [row.tobytes() for row in values]


def make_markov_source(order: int, alphabet: int, branching: int, concentration: float, seed: int) -> MarkovSource:
    """A seeded random chain (the same arguments always give the same chain)."""
    rng = np.random.default_rng(seed)
    contexts = alphabet**order
    keys = rng.random((contexts, alphabet))
    successors = np.argsort(keys, axis=1)[:, :branching]  # `branching` distinct symbols per context
    probs = rng.dirichlet(np.full(branching, concentration), size=contexts)
    return MarkovSource(order=order, alphabet=alphabet, successors=successors, probs=probs)


def _entropy_bits(p: np.ndarray) -> np.ndarray:
    """Row-wise entropy in bits; 0·log 0 = 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(p), 0.0)
    return terms.sum(axis=-1)
