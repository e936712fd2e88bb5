"""Power laws N_opt = k C^a fitted by least squares in log-log space, vectorised over resamples.

Approaches 1 and 2 both end here: from compute-optimal sizes N_opt at several budgets C,
a = slope of ln N_opt on ln C, D_opt = C / F(N_opt) with F(N) = k·N^p the FLOPs per token
(`FlopsPerToken`; 6N by default, so b = 1 − p·a), and the loss at the optimum as L_opt = k_L C^γ.
"""

from __future__ import annotations

import numpy as np

from jaxformer.scaling.allocation import SIX_ND, FlopsPerToken, PowerLawAllocation


def loglog_fit(C: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Slope and intercept of ln y on ln C along the last axis: ``[..., budgets]`` → ``[...]``, ``[...]``.

    NaN entries of y are left out of their row's fit; a row of fewer than two budgets has a NaN slope, silently.
    """
    x = np.broadcast_to(np.log(C), np.shape(y))
    ly = np.log(y)
    ok = np.isfinite(ly)
    n = ok.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0: a resample with no point, or one
        xm = np.where(ok, x, 0).sum(-1) / n
        ym = np.where(ok, ly, 0).sum(-1) / n
        dx = np.where(ok, x - xm[..., None], 0)
        slope = (dx * np.where(ok, ly - ym[..., None], 0)).sum(-1) / (dx * dx).sum(-1)
    return slope, ym - slope * xm


def allocation_from_optima(C: np.ndarray, n_opt: np.ndarray, loss_opt: np.ndarray,
                           flops: FlopsPerToken = SIX_ND) -> PowerLawAllocation:
    """Power laws through compute-optimal points (budgets, sizes, losses: ``[budgets]`` each); D_opt = C / F(N_opt)."""
    a, log_k = loglog_fit(C, n_opt)
    gamma, log_kl = loglog_fit(C, loss_opt)
    return allocation_through(float(np.exp(log_k)), float(a), flops, k_L=float(np.exp(log_kl)), gamma=float(gamma))


def allocation_through(k_N, a, flops: FlopsPerToken = SIX_ND, *, k_L=None, gamma=None) -> PowerLawAllocation:
    """N_opt = k_N C^a, and D_opt = C / F(N_opt) = C^(1 − p·a) / (k·k_N^p) with F(N) = k·N^p; k_N and a are
    numbers, or arrays of resampled laws (an infinite k_N gives D_opt = 0)."""
    with np.errstate(divide="ignore", over="ignore"):
        k_D = 1.0 / (flops.k * np.float64(k_N) ** flops.p)
    return PowerLawAllocation(k_N=k_N, a=a, k_D=k_D, b=1.0 - flops.p * a, k_L=k_L, gamma=gamma)


def power_law_samples(C: np.ndarray, n_opt: np.ndarray, flops: FlopsPerToken = SIX_ND) -> dict[str, np.ndarray]:
    """a, b and k_N ``[resamples]`` of the power laws through resampled optima ``[resamples, budgets]`` (NaN
    entries left out).

    A degenerate resample's intercept can overflow float64: its k_N is then inf (an open interval), silently.
    """
    a, log_k = loglog_fit(C, n_opt)
    with np.errstate(over="ignore"):
        k_N = np.exp(log_k)
    return {"a": a, "b": allocation_through(k_N, a, flops).b, "k_N": k_N}


def sample_allocations(samples: dict[str, np.ndarray], flops: FlopsPerToken = SIX_ND) -> PowerLawAllocation:
    """The resampled power laws (`power_law_samples`) as one allocation of ``[resamples, 1]`` fields, broadcast
    against ``[budgets]``; the loss at the optimum is not resampled."""
    return allocation_through(samples["k_N"][:, None], samples["a"][:, None], flops)
