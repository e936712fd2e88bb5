"""Scaling-law fits and compute-optimal allocation on any table of runs (Chinchilla Approaches 1–3).

Depends on numpy, scipy, JAX and matplotlib only — never on the model or training code.

    table = load_table("runs.csv").exclude_highest_loss(5)
    fit = fit_parametric(table)                      # Approach 3, 4500 L-BFGS starts at once
    boot = bootstrap_parametric(table, fit)          # SEs and percentile CIs
    allocate(fit.law, 5.76e23).rows()                # N_opt, D_opt, D/N, loss
    report = fit_table(table, "all"); report.write_plots("figures/")

Names are imported on first use, so ``jaxformer allocate`` does not pay for JAX or matplotlib.
"""

import importlib

_EXPORTS = {
    "allocation": ("PRESETS", "Allocation", "ParametricLaw", "PowerLawAllocation", "allocate", "load_law"),
    "bootstrap": ("BootstrapResult", "bootstrap_parametric"),
    "envelope": ("EnvelopeFit", "fit_envelope"),
    "isoflop": ("IsoFLOPFit", "fit_isoflop"),
    "parametric": ("ParametricFit", "fit_parametric", "hoffmann_grid"),
    "report": ("FitReport", "fit_table"),
    "table": ("RunTable", "load_table"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'jaxformer.scaling' has no attribute {name!r}")
    return getattr(importlib.import_module(f"jaxformer.scaling.{_MODULE_OF[name]}"), name)
