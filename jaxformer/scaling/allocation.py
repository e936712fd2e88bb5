"""Compute-optimal allocation in closed form: N_opt(C), D_opt(C), tokens per parameter, loss.

Training compute is C = F(N)·D with F the FLOPs per token. Hoffmann et al. (2022) take
F = 6N; a table whose C counts exact FLOPs (attention and the output head included) has
F = k·N^p with k > 6 and p < 1 for small models, fitted to its runs' C/D
(:class:`FlopsPerToken`). From a parametric law L = E + A/N^α + B/D^β, minimising
L(N, C/F(N)) gives (eq. 4 of Hoffmann et al. when k = 6, p = 1):

    N_opt = G (C/k)^a,   D_opt = C / F(N_opt) ∝ C^b,   G = (αA / (pβB))^(1/(α+pβ)),
    a = β/(α+pβ),        b = 1 − p·a.

From IsoFLOP power laws (Approach 2): N_opt = k_N C^a, D_opt = C / F(N_opt) = k_D C^b, and the
loss at the optimum L_opt = k_L C^γ fitted to the parabolas' minima.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from jaxformer.configs import shown
from jaxformer.files import load_json


@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token as a power of the parameter count: F(N) = k·N^p (C = F(N)·D)."""

    k: float = 6.0
    p: float = 1.0

    def __call__(self, N) -> np.ndarray:
        return self.k * np.asarray(N, np.float64) ** self.p

    @classmethod
    def fit(cls, N, D, C) -> "FlopsPerToken":
        """Least squares of ln(C/D) on ln N over the runs ``[Y]``; exactly 6N when every C is 6ND, and k·N with the
        runs' own (geometric mean) k when they share one size, which leaves no slope to fit."""
        N, per_token = np.asarray(N, np.float64), np.asarray(C, np.float64) / np.asarray(D, np.float64)
        if np.allclose(per_token, SIX_ND(N), rtol=1e-9):
            return SIX_ND
        if np.ptp(np.log(N)) == 0:
            return cls(k=float(np.exp(np.mean(np.log(per_token / N)))), p=1.0)
        p, log_k = np.polyfit(np.log(N), np.log(per_token), 1)
        return cls(k=float(np.exp(log_k)), p=float(p))

    @classmethod
    def from_dict(cls, d, source: str = "flops_per_token") -> "FlopsPerToken":
        """From ``{"k": …, "p": …}`` (`to_dict`); anything but two positive finite numbers raises one line."""
        if not (isinstance(d, dict) and set(d) == {"k", "p"}):
            raise ValueError(f"{source} must be an object with k and p, got {shown(d)}")
        return cls(**{name: _positive_number(d[name], f"{source}.{name}") for name in ("k", "p")})

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return "C = 6ND" if self == SIX_ND else f"C = {self.k:.4g}·N^{self.p:.4f}·D (fitted to the runs' C/D)"


SIX_ND = FlopsPerToken()


@dataclass(frozen=True)
class ParametricLaw:
    """L(N, D) = E + A/N^α + B/D^β (nats/token); its allocation counts compute with ``flops``."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    flops: FlopsPerToken = SIX_ND

    @classmethod
    def from_log_params(cls, x, flops: FlopsPerToken = SIX_ND) -> "ParametricLaw":
        """From the fit's (log A, log B, log E, α, β)."""
        log_a, log_b, log_e, alpha, beta = (float(v) for v in x)
        return cls(E=float(np.exp(log_e)), A=float(np.exp(log_a)), B=float(np.exp(log_b)), alpha=alpha, beta=beta,
                   flops=flops)

    @classmethod
    def from_dict(cls, d: dict, source: str = "law") -> "ParametricLaw":
        missing = [k for k in ("E", "A", "B", "alpha", "beta") if k not in d]
        if missing:
            raise ValueError(f"{source}: missing {', '.join(missing)} (need E, A, B, alpha, beta)")
        values = {k: _number(d[k], f"{source}: {k}") for k in ("E", "A", "B", "alpha", "beta")}
        bad = [k for k, v in values.items() if not (np.isfinite(v) and (v > 0 or k == "E" and v >= 0))]
        if bad:
            raise ValueError(f"{source}: {bad[0]} must be positive and finite, got {values[bad[0]]!r}")
        return cls(**values)

    def to_dict(self) -> dict:
        """The law's five parameters (its FLOP count is the fit's, recorded beside it)."""
        return {k: getattr(self, k) for k in ("E", "A", "B", "alpha", "beta")}

    def loss(self, N, D) -> np.ndarray:
        N, D = np.asarray(N, np.float64), np.asarray(D, np.float64)
        return self.E + self.A / N**self.alpha + self.B / D**self.beta

    @property
    def a(self):
        """N_opt ∝ C^a; nan where α + pβ ≤ 0 (the loss does not fall along the iso-FLOP lines' optimum)."""
        denominator = np.asarray(self.alpha + self.flops.p * self.beta, np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(denominator > 0, self.beta / denominator, np.nan)
        return float(a) if np.ndim(a) == 0 else a

    @property
    def b(self):
        """D_opt ∝ C^b; nan where ``a`` is."""
        return 1.0 - self.flops.p * self.a

    @property
    def has_optimum(self):
        """Whether the loss falls with both N and D (A, B, α, β > 0), so that a compute-optimal split exists
        (elementwise for a law of arrays, as a bootstrap's)."""
        return np.all([np.asarray(v) > 0 for v in (self.A, self.B, self.alpha, self.beta)], axis=0)

    @property
    def G(self):
        """N_opt = G·(C/k)^a; nan for a law without an optimum (`has_optimum`)."""
        p = self.flops.p
        alpha, beta = np.asarray(self.alpha, np.float64), np.asarray(self.beta, np.float64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = np.where(self.has_optimum, alpha * self.A / (p * beta * self.B), np.nan)
            G = ratio ** (1.0 / (alpha + p * beta))
        return float(G) if np.ndim(G) == 0 else G

    def n_opt(self, C) -> np.ndarray:
        return self.G * (np.asarray(C, np.float64) / self.flops.k) ** self.a

    def d_opt(self, C) -> np.ndarray:
        return np.asarray(C, np.float64) / self.flops(self.n_opt(C))

    def loss_opt(self, C) -> np.ndarray:
        return self.loss(self.n_opt(C), self.d_opt(C))


@dataclass(frozen=True)
class PowerLawAllocation:
    """N_opt = k_N C^a, D_opt = k_D C^b, L_opt = k_L C^γ (from Approach 1 or 2)."""

    k_N: float
    a: float
    k_D: float
    b: float
    k_L: float | None = None
    gamma: float | None = None

    def n_opt(self, C) -> np.ndarray:
        # In logs, so that resampled laws held as arrays (`powerlaw.sample_allocations`) take an infinite k_N
        # to an infinite N_opt (an open band) rather than inf·0 = NaN against an underflowed C^a.
        with np.errstate(over="ignore", divide="ignore"):
            return np.exp(np.log(self.k_N) + self.a * np.log(np.asarray(C, np.float64)))

    def d_opt(self, C) -> np.ndarray:
        return self.k_D * np.asarray(C, np.float64) ** self.b

    def loss_opt(self, C) -> np.ndarray:
        if self.k_L is None:
            return np.full(np.shape(C), np.nan)
        return self.k_L * np.asarray(C, np.float64) ** self.gamma

    def to_dict(self) -> dict:
        return asdict(self)


Law = ParametricLaw | PowerLawAllocation

# Hoffmann et al. (2022) Approach 3 as published; Besiroglu et al. (2024) refit of the same data.
PRESETS: dict[str, ParametricLaw] = {
    "chinchilla": ParametricLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28),
    "epoch": ParametricLaw(E=1.817, A=482.0, B=2085.4, alpha=0.348, beta=0.366),
}


def load_law(path: str | Path, approach: str | None = None) -> tuple[str, Law]:
    """``(name, law)`` from a JSON file: the output of `jaxformer fit --json` or a bare {E, A, B, alpha, beta}.

    From a fit, ``approach`` ``"3"`` is the parametric law (the default when present), ``"1"``
    or ``"2"`` their power laws; anything the file does not hold raises ``ValueError``.
    """
    data = load_json(Path(path))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    available = [k for k in ("3", "2", "1") if f"approach{k}" in data]
    if approach is None and not available:  # a bare law: from_dict names what it lacks
        return "law", ParametricLaw.from_dict(data, str(path))
    approach = approach or available[0]
    if approach not in available:
        raise ValueError(f"{path}: no approach {approach} fit in it (has: {', '.join(available) or 'none'})")
    fit, key = data[f"approach{approach}"], "params" if approach == "3" else "power_laws"
    if not (isinstance(fit, dict) and isinstance(fit.get(key), dict)):
        raise ValueError(f"{path}: approach{approach}.{key} is missing or not an object (`jaxformer fit --json` writes it)")
    try:
        if approach == "3":
            flops = (FlopsPerToken.from_dict(data["flops_per_token"], f"{path}: flops_per_token")
                     if "flops_per_token" in data else SIX_ND)
            return "approach 3", replace(ParametricLaw.from_dict(fit[key], f"{path}: approach3.params"), flops=flops)
        laws = {name: None if value is None and name in ("k_L", "gamma") else  # the loss law is optional
                (_positive_number if name in POSITIVE else _finite_number)(
                    value, f"{path}: approach{approach}.power_laws.{name}") for name, value in fit[key].items()}
        return f"approach {approach}", PowerLawAllocation(**laws)
    except TypeError as error:  # fields the dataclasses do not have, or lack
        raise ValueError(f"{path}: approach{approach}: {error}") from None


POSITIVE = ("k_N", "k_D", "k_L")  # a power law's coefficients: N_opt, D_opt and L_opt are positive


def _number(value, name: str) -> float:
    """``value`` as a float; a bool, a string or a list raises one line naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {shown(value)}")
    return float(value)


def _finite_number(value, name: str) -> float:
    value = _number(value, name)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _positive_number(value, name: str) -> float:
    value = _number(value, name)
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return value


def budget_labels(budgets) -> list[str]:
    """Each FLOP budget as a label (the key of a per-budget quantity): three significant figures (``5.76e+23``), or
    as many more as tell every two distinct budgets apart (1e21 and 1.004e21: ``1e+21``, ``1.004e+21``)."""
    values = [float(C) for C in budgets]
    for digits in range(3, 17):
        labels = [f"{C:.{digits}g}" for C in values]
        if len(set(labels)) == len(set(values)):
            return labels
    return [f"{C:.17g}" for C in values]  # 17 significant figures tell any two doubles apart


@dataclass(frozen=True)
class Allocation:
    """Compute-optimal N, D, D/N and loss at each budget; arrays ``[budgets]``."""

    C: np.ndarray
    N: np.ndarray
    D: np.ndarray
    tokens_per_param: np.ndarray
    loss: np.ndarray

    def rows(self) -> list[dict]:
        return [
            {"flops": float(c), "N_opt": float(n), "D_opt": float(d), "tokens_per_param": float(t),
             "loss": float(l) if np.isfinite(l) else None}
            for c, n, d, t, l in zip(self.C, self.N, self.D, self.tokens_per_param, self.loss)
        ]


def allocate(law: Law, flops) -> Allocation:
    """N_opt, D_opt, tokens per parameter and predicted loss at each budget C (FLOPs)."""
    C = np.atleast_1d(np.asarray(flops, np.float64))
    bad = np.flatnonzero(~(np.isfinite(C) & (C > 0)))
    if bad.size:
        raise ValueError(f"flops must be positive and finite, got {float(C[bad[0]])!r}")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):  # a law without an optimum
        N, D = law.n_opt(C), law.d_opt(C)
        return Allocation(C, N, D, D / N, law.loss_opt(C))
