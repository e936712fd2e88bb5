"""All approaches on one table: ``fit_table`` → ``FitReport`` (text, JSON, laws, plots).

``approaches="all"`` runs what the table supports: Approach 3 always, Approach 2 when the
runs carry IsoFLOP budget labels (a budget column, or a sweep's plan), Approach 1 when they
carry training curves. Asking for an approach explicitly runs it or fails with one line
(Approach 2 then groups runs by C when there are no labels).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from jaxformer.scaling.allocation import FlopsPerToken, Law, budget_labels
from jaxformer.scaling.bootstrap import (REFERENCE_BUDGET, RESAMPLES, BootstrapResult, Interval, bootstrap_parametric,
                                         law_quantities, percentiles, sample_laws)
from jaxformer.scaling.envelope import EnvelopeFit, fit_envelope
from jaxformer.scaling.isoflop import IsoFLOPFit, fit_isoflop
from jaxformer.scaling.parametric import PARAMS, ParametricFit, fit_parametric
from jaxformer.scaling.powerlaw import sample_allocations
from jaxformer.scaling.table import RunTable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

APPROACHES = ("1", "2", "3", "all")


@dataclass
class FitReport:
    table: RunTable
    approach3: ParametricFit | None = None
    bootstrap3: BootstrapResult | None = None
    approach2: IsoFLOPFit | None = None
    approach1: EnvelopeFit | None = None
    budgets: tuple[float, ...] = (REFERENCE_BUDGET,)
    level: float = 0.95
    notes: list[str] = field(default_factory=list)

    def laws(self) -> dict[str, Law]:
        """label → law with n_opt/d_opt/loss_opt, for allocation and plots."""
        out: dict[str, Law] = {}
        if self.approach1:
            out["Approach 1"] = self.approach1.allocation
        if self.approach2:
            out["Approach 2"] = self.approach2.allocation
        if self.approach3:
            out["Approach 3"] = self.approach3.law
        return out

    @property
    def flops(self) -> FlopsPerToken:
        """How the table counts training compute per token, which every approach's D_opt = C / F(N_opt) uses."""
        return FlopsPerToken.fit(self.table.N, self.table.D, self.table.C)

    def to_dict(self) -> dict:
        out: dict = {"source": self.table.source, "runs": len(self.table), "notes": self.notes,
                     "flops_per_token": self.flops.to_dict()}
        if self.approach3:
            fit, law = self.approach3, self.approach3.law
            out["approach3"] = {
                "params": law.to_dict(),
                "log_params": dict(zip(PARAMS, map(float, fit.x))),
                "objective": fit.objective,
                "huber_delta": fit.delta,
                "a": law.a, "b": law.b, "G": law.G,
                "tokens_per_param": {label: float(law.d_opt(C) / law.n_opt(C))
                                     for C, label in zip(self.budgets, budget_labels(self.budgets))},
                "convergence": fit.convergence,
                "bootstrap": None if self.bootstrap3 is None else self.bootstrap3.to_dict(),
            }
        if self.approach2:
            out["approach2"] = self.approach2.to_dict()
        if self.approach1:
            out["approach1"] = self.approach1.to_dict()
        out["warnings"] = self.approach2.warnings if self.approach2 else []
        out["agreement"] = self.agreement()
        return out

    def frontier_bands(self, flops) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """label → (low, high) ``[budgets]`` percentile band of N_opt at each budget C, from each bootstrapped
        approach's resampled laws (Approach 3: E, A, B, α, β; Approaches 2 and 1: a, k_N). An approach none of whose
        resamples gave a law (Approach 2 when no resample bracketed two budgets' minima, Approach 1 when none had two
        sizes on its envelope) has no band."""
        C = np.asarray(flops, np.float64)[None]
        found = {}
        if self.approach3 and self.bootstrap3:
            found["Approach 3"] = sample_laws(self.bootstrap3.samples, self.approach3.law.flops).n_opt(C)
        if self.approach2 and self.approach2.samples:
            found["Approach 2"] = sample_allocations(self.approach2.samples, self.approach2.flops).n_opt(C)
        if self.approach1 and self.approach1.samples:
            found["Approach 1"] = sample_allocations(self.approach1.samples, self.flops).n_opt(C)
        return {label: tuple(np.nanpercentile(n, percentiles(self.level), axis=0)) for label, n in found.items()
                if np.isfinite(n).any()}

    def outside_intervals(self) -> list[str]:
        """``"Approach k: name value [low, high]"`` for each point estimate outside its own bootstrap interval."""
        found = [("3", self.bootstrap3.stats if self.bootstrap3 else None),
                 ("2", self.approach2.stats if self.approach2 else None),
                 ("1", self.approach1.stats if self.approach1 else None)]
        return [f"Approach {approach}: {name} {s.value:.4g} [{s.low:.4g}, {s.high:.4g}]"
                for approach, stats in found for name, s in (stats or {}).items() if s.outside]

    def agreement(self) -> dict | None:
        """Whether Approaches 2 and 3 agree on the exponent a: do their intervals overlap?

        None unless both ran; ``agree`` is None when either has no bootstrap interval (none drawn, or none of its
        resamples kept: a NaN interval, which overlaps nothing and contradicts nothing).
        """
        if not (self.approach2 and self.approach3):
            return None
        a2, a3 = (self.approach2.stats or {}).get("a"), (self.bootstrap3.stats if self.bootstrap3 else {}).get("a")
        interval2, interval3 = _interval(a2), _interval(a3)
        out = {"a2": self.approach2.allocation.a, "a3": self.approach3.law.a, "level": self.level,
               "interval2": interval2, "interval3": interval3, "agree": None}
        if interval2 is not None and interval3 is not None:
            out["agree"] = bool(interval2[0] <= interval3[1] and interval3[0] <= interval2[1])
        return out

    def agreement_text(self) -> str | None:
        found = self.agreement()
        if found is None:
            return None
        values = f"a = {found['a2']:.3f} (Approach 2) and {found['a3']:.3f} (Approach 3)"
        if found["agree"] is None:
            missing = " or ".join(f"Approach {k}" for k in ("2", "3") if found[f"interval{k}"] is None)
            return f"{values}; no bootstrap interval for {missing}, so their agreement is not assessed"
        level = f"{100 * found['level']:.0f}%"
        (l2, h2), (l3, h3) = found["interval2"], found["interval3"]
        verdict = "agree: their" if found["agree"] else "disagree: their"
        return (f"Approaches 2 and 3 {verdict} {level} intervals for a, [{l2:.3f}, {h2:.3f}] and [{l3:.3f}, {h3:.3f}], "
                f"{'overlap' if found['agree'] else 'do not overlap'} ({values})")

    def text(self) -> str:
        lines = [f"{len(self.table)} runs from {self.table.source}; compute per run {self.flops.describe()}"]
        if self.approach3:
            fit, law = self.approach3, self.approach3.law
            conv = fit.convergence
            lines += ["", "Approach 3: L = E + A/N^alpha + B/D^beta (Huber on log loss; L-BFGS from "
                      f"{conv['starts']} starts: {conv['converged']} converged, {conv['reached_best']} within 1e-6 "
                      "of the best)"]
            stats = self.bootstrap3.stats if self.bootstrap3 else {}
            lines += [_line(k, v, stats.get(k), self.level) for k, v in law_quantities(law, self.budgets).items()]
            if not law.has_optimum:
                lines.append("  no compute-optimal allocation: the fitted loss does not fall with both N and D "
                             "(A, B, alpha and beta must be positive)")
            lines.append(f"  objective {fit.objective:.10g}")
            if self.bootstrap3 and self.bootstrap3.groups:
                lines.append(f"  intervals: each resample draws {self.bootstrap3.groups} groups of runs, not single runs")
        for name, fit in (("2 (IsoFLOP parabolas)", self.approach2), ("1 (loss envelope)", self.approach1)):
            if fit is None:
                continue
            law = fit.allocation
            stats = fit.stats or {}
            lines += ["", f"Approach {name}: N_opt = k_N C^a, D_opt = k_D C^b"]
            lines += [_line(k, getattr(law, k), stats.get(k), self.level) for k in ("a", "b", "k_N")]
        if self.agreement_text():
            lines += ["", self.agreement_text()]
        if self.approach2 and self.approach2.warnings:
            lines += ["", *(f"warning: {w}" for w in self.approach2.warnings)]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def write_plots(self, directory: str | Path) -> list[Path]:
        """PNG and SVG of every figure the fitted approaches support (`figures`), all drawn before any is written
        (`plots.save_all`)."""
        from jaxformer.scaling import plots

        return plots.save_all(self.figures(), directory)

    def figures(self) -> dict[str, Figure]:
        """Every figure the fitted approaches support, by name (matplotlib ``Figure`` objects, drawn, not written)."""
        from jaxformer.scaling import plots  # matplotlib is imported only by a fit that draws

        figures = {}
        t = self.table
        if self.approach2:
            figures["isoflop"] = plots.plot_isoflop(self.approach2)
        if self.approach3:
            figures["contour"] = plots.plot_contour(self.approach3.law, t)
            figures["residuals"] = plots.plot_residuals(self.approach3.law, t)
        points = {}
        if self.approach1:
            every = max(len(self.approach1.flops) // 25, 1)
            points["loss envelope"] = (self.approach1.flops[::every], self.approach1.n_opt[::every])
        if self.approach2:
            points["IsoFLOP minima"] = ([p.budget for p in self.approach2.profiles],
                                        [p.n_opt for p in self.approach2.profiles])
        flops_range = (t.C.min() / 3, max(t.C.max() * 3, 10 * REFERENCE_BUDGET))
        figures["n_opt"] = plots.plot_nopt(self.laws(), flops_range, points, bands=self.frontier_bands)
        return figures


def _interval(stat: Interval | None) -> list[float] | None:
    """``[low, high]`` of a bootstrap interval, or None where there is none (no bootstrap, or no resample kept)."""
    return None if stat is None or np.isnan(stat.low) or np.isnan(stat.high) else [stat.low, stat.high]


def _line(name: str, value: float, interval: Interval | None, level: float) -> str:
    text = f"  {name:<26} {value:12.6g}"
    if interval is not None:
        text += f"   SE {interval.se:<9.3g} {100 * level:.0f}% CI [{interval.low:.4g}, {interval.high:.4g}]"
    return text


def fit_table(table: RunTable, approaches: str | int = "all", *, resamples: int = RESAMPLES, seed: int = 0,
              level: float = 0.95, budgets=(REFERENCE_BUDGET,), budget_tol: float = 0.1,
              bootstrap_starts: int = 4, keep_edges: bool = False, resample2: str = "runs") -> FitReport:
    """Runs the requested approaches (``"1"``, ``"2"`` or ``"3"``, also as a number, or ``"all"``) with bootstrap
    intervals; Approach 2 fits its power laws to the bracketed minima only, unless ``keep_edges``, and its bootstrap
    draws ``resample2`` (`fit_isoflop`'s ``runs`` or ``residuals``).

    With ``"all"``, an approach the runs cannot support (``ValueError``: too few runs, sizes or budgets) is
    skipped with a note naming why, and the others stand; ``ValueError`` when none can be fitted."""
    if not isinstance(approaches, (str, int)) or isinstance(approaches, bool) or str(approaches) not in APPROACHES:
        raise ValueError(f"approach must be one of 1, 2, 3 or 'all', got {approaches!r}")
    approaches = str(approaches)
    if resamples < 0 or resamples == 1:  # one resample is no interval (Approach 3's bootstrap refuses it too)
        raise ValueError(f"bootstrap resamples must be 0 (no intervals) or at least 2, got {resamples}")
    table = table.canonical()  # the same runs in any order give the same fit
    report = FitReport(table, budgets=tuple(float(b) for b in budgets), level=level)
    run_all = approaches == "all"

    def approach3() -> None:
        fitted = fit_parametric(table)
        if resamples:
            report.bootstrap3 = bootstrap_parametric(table, fitted, resamples=resamples, seed=seed, level=level,
                                                     budgets=report.budgets, starts=bootstrap_starts)
        report.approach3 = fitted

    def approach2() -> None:
        report.approach2 = fit_isoflop(table, budget_tol=budget_tol, resamples=resamples, seed=seed, level=level,
                                       keep_edges=keep_edges, resample=resample2)

    def approach1() -> None:
        report.approach1 = fit_envelope(table, resamples=resamples, seed=seed, level=level)

    if approaches in ("3", "all"):
        _fit_approach("3", approach3, report, skip=run_all)
    if approaches == "2" or (run_all and table.budget is not None):
        _fit_approach("2", approach2, report, skip=run_all)
    elif run_all:
        report.notes.append("Approach 2 skipped: the runs carry no IsoFLOP budget labels (use --approach 2 "
                            "to group them by C)")
    if approaches == "1" or (run_all and table.has_curves):
        _fit_approach("1", approach1, report, skip=run_all)
    elif run_all:
        report.notes.append("Approach 1 skipped: the runs carry no training curves")
    if not (report.approach1 or report.approach2 or report.approach3):
        raise ValueError("; ".join(report.notes))
    return report


def _fit_approach(name: str, fit: Callable[[], None], report: FitReport, *, skip: bool) -> None:
    """Runs ``fit``; with ``skip``, a ``ValueError`` (runs it cannot support) becomes a note on ``report``."""
    try:
        fit()
    except ValueError as error:
        if not skip:
            raise
        report.notes.append(f"Approach {name} skipped: {error}")


def jsonable(obj):
    """Numpy scalars to Python, non-finite floats to None (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj
