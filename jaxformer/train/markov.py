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
from typing import TYPE_CHECKING

import numpy as np

from jaxformer.configs import NON_NEGATIVE, POSITIVE, Range, Section, setting

if TYPE_CHECKING:
    import scipy.sparse

STATIONARY_STEPS, STATIONARY_TOL = 20_000, 1e-15  # power iteration: at most this many steps, to this L1 change
DIRECT_CONTEXTS = 1 << 12  # a chain of at most this many contexts that has not converged is solved (a dense solve)


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
        """π over contexts: where the chain started uniformly over contexts settles (its Cesàro limit), computed once:
        by power iteration (`stationary_by_power`, quick for a chain that mixes), else, for a chain of at
        most `DIRECT_CONTEXTS` contexts, exactly (`stationary_by_solve`); ``ValueError`` for a larger one."""
        try:
            return stationary_by_power(self)
        except ValueError:
            if self.num_contexts > DIRECT_CONTEXTS:
                raise
            return stationary_by_solve(self)

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


def transition_matrix(source: MarkovSource) -> scipy.sparse.csr_array:
    """``[contexts, contexts]``: the probability of moving from context c (row) to context c' (column)."""
    import scipy.sparse  # imported here: only a chain that power iteration cannot settle needs it

    rows = np.repeat(np.arange(source.num_contexts), source.successors.shape[1])
    shape = (source.num_contexts,) * 2
    return scipy.sparse.csr_array((source.probs.ravel(), (rows, source._next_contexts().ravel())), shape=shape)


def closed_classes(source: MarkovSource) -> list[np.ndarray]:
    """The chain's closed classes: the strongly connected sets of contexts that no transition leaves (sorted)."""
    import scipy.sparse.csgraph

    matrix = transition_matrix(source)
    count, label = scipy.sparse.csgraph.connected_components(matrix, directed=True, connection="strong")
    moves = matrix.tocoo()
    escapes = np.bincount(label[moves.row[label[moves.row] != label[moves.col]]], minlength=count) > 0
    return [np.flatnonzero(label == k) for k in np.flatnonzero(~escapes)]


def stationary_by_solve(source: MarkovSource) -> np.ndarray:
    """π exactly, however slowly the chain mixes: each closed class K (`closed_classes`) has its own stationary
    distribution π_K, the solution of π_K P_KK = π_K with Σ π_K = 1; a uniform start reaches K with probability
    u(K) plus the visits v to the transient contexts T times their moves into K, where v (I − P_TT) = u_T.
    π = Σ_K reach(K) π_K, zero on T."""
    sparse, n, classes = transition_matrix(source), source.num_contexts, closed_classes(source)
    transient = np.setdiff1d(np.arange(n), np.concatenate(classes))
    reach = np.full(n, 1.0 / n)
    if len(transient):
        visits = np.linalg.solve(_minus_identity(sparse[transient][:, transient]).T, -reach[transient])
        reach += visits @ sparse[transient]  # (read on the closed classes only)
    pi = np.zeros(n)
    for members in classes:
        equations = _minus_identity(sparse[members][:, members]).T
        equations[-1] = 1.0  # one balance equation is redundant: it is replaced by Σ π_K = 1
        unit = np.zeros(len(members))
        unit[-1] = 1.0
        pi_k = np.linalg.solve(equations, unit).clip(min=0.0)  # LU's −1e-18s are zeros
        pi[members] = reach[members].sum() * pi_k / pi_k.sum()
    return pi


def _minus_identity(block: scipy.sparse.csr_array) -> np.ndarray:
    """``block − I`` as a dense array."""
    dense = block.toarray()
    dense[np.diag_indices_from(dense)] -= 1.0
    return dense


def stationary_by_power(source: MarkovSource) -> np.ndarray:
    """π by power iteration of the lazy chain (same fixed points, aperiodic) from the uniform distribution;
    ``ValueError`` when it has not converged after `STATIONARY_STEPS` steps."""
    next_ctx = source._next_contexts().ravel()
    pi = np.full(source.num_contexts, 1.0 / source.num_contexts)
    for _ in range(STATIONARY_STEPS):
        moved = np.bincount(next_ctx, weights=(pi[:, None] * source.probs).ravel(), minlength=source.num_contexts)
        new = 0.5 * (pi + moved)
        if np.abs(new - pi).sum() < STATIONARY_TOL:
            return new / new.sum()
        pi = new
    raise ValueError(f"the chain's stationary distribution did not converge in {STATIONARY_STEPS:,} steps: it "
                     "mixes too slowly (transitions of near-zero probability between its parts)")


def _entropy_bits(p: np.ndarray) -> np.ndarray:
    """Row-wise entropy in bits; 0·log 0 = 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(p), 0.0)
    return terms.sum(axis=-1)
