"""Figures of the fits (matplotlib ``Figure`` objects, no pyplot state), saved as PNG and SVG.

- ``plot_isoflop``: loss against N at each budget, the fitted parabolas and their minima.
- ``plot_contour``: the Approach-3 loss over (N, D), the efficient frontier, iso-FLOP lines.
- ``plot_nopt``: N_opt against C for each approach, with Chinchilla's published law.
- ``plot_residuals``: log-loss residuals of the Approach-3 fit against C and N.
- ``plot_tuning``: loss against learning rate at each tuned size, and the optima's power law in N.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from jaxformer.files import write_all_atomic
from jaxformer.scaling.allocation import PRESETS, Law, ParametricLaw
from jaxformer.scaling.isoflop import IsoFLOPFit
from jaxformer.scaling.parametric import residuals
from jaxformer.scaling.table import RunTable
from jaxformer.scaling.tuning import TuneFit


def plot_isoflop(fit: IsoFLOPFit) -> Figure:
    fig = Figure(figsize=(6.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    cmap = colormaps["viridis"]
    for k, p in enumerate(fit.profiles):
        color = cmap(k / max(len(fit.profiles) - 1, 1))
        ax.scatter(p.N, p.loss, s=14, color=color)
        N = np.geomspace(p.N.min() / 1.5, p.N.max() * 1.5, 100)
        ax.plot(N, p.curve(N), color=color, lw=1, label=f"C = {p.budget:.2g}")
        ax.scatter([p.n_opt], [p.loss_opt], marker="*", s=90, color=color, edgecolor="black",
                   linewidth=0.5 if p.bracketed else 1.5, zorder=3)
    ax.set(xscale="log", xlabel="parameters N", ylabel="final loss", title="IsoFLOP profiles (★ minimum)")
    ax.legend(fontsize=7)
    return fig


def plot_contour(law: ParametricLaw, table: RunTable | None = None, flops=None) -> Figure:
    """log-spaced grid over the data's (or the frontier's) range of N and D."""
    if table is not None:
        n_range, d_range = (table.N.min() / 3, table.N.max() * 3), (table.D.min() / 3, table.D.max() * 3)
    else:
        n_range, d_range = (1e7, 1e12), (1e8, 1e14)
    N, D = np.meshgrid(np.geomspace(*n_range, 200), np.geomspace(*d_range, 200))
    fig = Figure(figsize=(6.5, 5), layout="constrained")
    ax = fig.add_subplot()
    L = law.loss(N, D)
    levels = np.geomspace(L.min(), np.percentile(L, 95), 15)
    contour = ax.contourf(N, D, L, levels=levels, cmap="magma", norm=LogNorm())
    fig.colorbar(contour, ax=ax, label="predicted loss", format="%.2f")
    C_lo, C_hi = float(law.flops(n_range[0])) * d_range[0], float(law.flops(n_range[1])) * d_range[1]
    C = np.geomspace(C_lo, C_hi, 200)
    ax.plot(law.n_opt(C), law.d_opt(C), color="cyan", lw=2, label="efficient frontier")
    for c in np.geomspace(C_lo, C_hi, 9)[1:-1] if flops is None else np.atleast_1d(flops):
        ax.plot(N[0], c / law.flops(N[0]), color="white", lw=0.7, ls="--")
        ax.annotate(f"{c:.0e}", (law.n_opt(c), law.d_opt(c)), color="white", fontsize=7)
    if table is not None:
        ax.scatter(table.N, table.D, s=6, color="white", edgecolor="black", linewidth=0.3, label="runs")
    ax.set(xscale="log", yscale="log", xlim=n_range, ylim=d_range, xlabel="parameters N", ylabel="tokens D",
           title="L(N, D) with iso-FLOP lines (dashed, FLOPs)")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def plot_nopt(laws: dict[str, Law], flops_range: tuple[float, float], points: dict | None = None,
              reference: ParametricLaw = PRESETS["chinchilla"], bands=None) -> Figure:
    """``laws``: label → law with ``n_opt``; ``points``: label → (C, N_opt) markers; ``bands``: a callable
    C → {label: (low, high)} of N_opt intervals (`FitReport.frontier_bands`), shaded around each law."""
    C = np.geomspace(*flops_range, 100)
    shaded = bands(C) if bands else {}
    fig = Figure(figsize=(6.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for label, law in laws.items():
        line, = ax.plot(C, law.n_opt(C), lw=1.8, label=f"{label} (a = {law.a:.3f})")
        if label in shaded:
            ax.fill_between(C, *shaded[label], color=line.get_color(), alpha=0.2, lw=0)
    for label, (c, n) in (points or {}).items():
        ax.scatter(c, n, s=14, label=label)
    ax.plot(C, reference.n_opt(C), color="black", ls="--", lw=1, label=f"Chinchilla published (a = {reference.a:.3f})")
    ax.set(xscale="log", yscale="log", xlabel="training FLOPs C", ylabel="compute-optimal N", title="N_opt(C)")
    ax.legend(fontsize=8)
    return fig


def plot_residuals(law: ParametricLaw, table: RunTable) -> Figure:
    r = residuals(law, table)
    fig = Figure(figsize=(9, 3.8), layout="constrained")
    for k, (x, name) in enumerate([(table.C, "training FLOPs C"), (table.N, "parameters N")]):
        ax = fig.add_subplot(1, 2, k + 1)
        ax.axhline(0, color="gray", lw=0.8)
        points = ax.scatter(x, r, s=8, c=table.D / table.N, cmap="viridis", norm=LogNorm())
        ax.set(xscale="log", xlabel=name, ylabel="log L − log L̂")
    fig.colorbar(points, ax=fig.axes, label="tokens per parameter")
    fig.suptitle(f"Approach 3 residuals (RMS {np.sqrt(np.mean(r * r)):.4f})")
    return fig


def plot_tuning(fit: TuneFit) -> Figure:
    """Left: final loss against peak learning rate per size, each refining parabola and optimum (★; hollow
    at a grid edge), diverged runs (×) along the top. Right: the optima against N with the fitted rule."""
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    curves, optima = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    cmap = colormaps["viridis"]
    finite = np.isfinite(fit.loss)
    top = fit.loss[finite].max() if finite.any() else 1.0
    for k, o in enumerate(fit.optima):
        color = cmap(k / max(len(fit.optima) - 1, 1))
        here = fit.N == o.N
        order = np.argsort(fit.lr[here])
        lr, loss = fit.lr[here][order], fit.loss[here][order]
        ok = np.isfinite(loss)
        curves.plot(lr[ok], loss[ok], "o-", ms=4, lw=0.8, color=color, label=f"N = {o.N:,.0f}")
        curves.scatter(lr[~ok], np.full((~ok).sum(), top), marker="x", color=color)
        if o.refined:
            i = int(np.searchsorted(lr, o.grid_lr))
            u = np.log(lr[i - 1:i + 2])
            p = np.polyfit(u, loss[i - 1:i + 2], 2)
            grid = np.linspace(u[0], u[2], 50)
            curves.plot(np.exp(grid), np.polyval(p, grid), color=color, lw=1.6, alpha=0.6)
        curves.scatter([o.lr], [o.loss], marker="*", s=110, zorder=3, edgecolor="black",
                       color="white" if o.edge else color)
    curves.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss",
               title="tuning runs (★ optimum, hollow at a grid edge, × diverged)")
    curves.legend(fontsize=7)
    N = np.array([o.N for o in fit.optima])
    lr_opt = np.array([o.lr for o in fit.optima])
    edge = np.array([o.edge is not None for o in fit.optima])
    optima.scatter(N[~edge], lr_opt[~edge], s=30, color="C0", label="optimum")
    optima.scatter(N[edge], lr_opt[edge], s=30, facecolor="none", edgecolor="C0", label="at a grid edge")
    line = np.geomspace(N.min() / 1.5, N.max() * 1.5, 50)
    optima.plot(line, fit.rule.lr(line), color="C1", lw=1.5, label=f"lr = {fit.rule.formula}")
    optima.set(xscale="log", yscale="log", xlabel="parameters N", ylabel="best peak learning rate",
               title=f"lr_opt ∝ N^{fit.rule.k:.3f}")
    optima.legend(fontsize=7)
    return fig


def save(fig: Figure, directory: str | Path, name: str) -> list[Path]:
    """Writes ``name.png`` and ``name.svg`` (`save_all`)."""
    return save_all({name: fig}, directory)


def save_all(figures: dict[str, Figure], directory: str | Path) -> list[Path]:
    """Writes ``name.png`` and ``name.svg`` of each figure, all or none (`write_all_atomic`): every file is
    rendered, and every target checked, before the first is written (`render_all`), and a write that fails midway
    (a full disk, a directory turned read-only) leaves none of them written and the files there before as they were."""
    rendered = render_all(figures, directory)
    Path(directory).mkdir(parents=True, exist_ok=True)
    write_all_atomic(rendered)
    return list(rendered)


def render_all(figures: dict[str, Figure], directory: str | Path) -> dict[Path, bytes]:
    """The bytes of ``directory/name.png`` and ``name.svg`` of each figure, nothing written (drawing takes seconds,
    writing milliseconds: a caller can keep the writes alone from being cut short); a directory standing where a
    figure goes raises ``ValueError``."""
    directory = Path(directory)
    rendered: dict[Path, bytes] = {}
    for name, fig in figures.items():
        for ext in ("png", "svg"):
            buffer = io.BytesIO()
            fig.savefig(buffer, format=ext, dpi=150)
            rendered[directory / f"{name}.{ext}"] = buffer.getvalue()
    taken = [path for path in rendered if path.is_dir()]
    if taken:
        raise ValueError(f"{taken[0]} is a directory, where a figure goes")
    return rendered
