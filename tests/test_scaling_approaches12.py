"""Approaches 1 and 2 recover the exponent of a known law from synthetic sweeps."""

import numpy as np
import pytest

from jaxformer.scaling.allocation import PRESETS
from jaxformer.scaling.envelope import fit_envelope
from jaxformer.scaling.isoflop import fit_isoflop, group_budgets
from jaxformer.scaling.synthetic import isoflop_sweep
from jaxformer.scaling.table import RunTable

LAW = PRESETS["chinchilla"]  # a = 0.4516
BUDGETS = np.logspace(18, 21, 7)


def test_isoflop_recovers_a_and_b_with_intervals():
    fit = fit_isoflop(isoflop_sweep(LAW, BUDGETS, noise=0.002), resamples=500, seed=0)
    assert fit.allocation.a == pytest.approx(LAW.a, abs=0.01)
    assert fit.allocation.b == pytest.approx(LAW.b, abs=0.01)
    assert fit.stats["a"].low < LAW.a < fit.stats["a"].high
    assert 0 < fit.stats["a"].se < 0.02
    for p in fit.profiles:  # each minimum lands on the law's optimum
        assert p.n_opt == pytest.approx(float(LAW.n_opt(p.budget)), rel=0.1)
        assert p.bracketed
    assert fit.warnings == []
    np.testing.assert_allclose(fit.allocation.d_opt(BUDGETS) * fit.allocation.n_opt(BUDGETS) * 6, BUDGETS)


def test_isoflop_groups_by_c_without_labels_and_warns_at_the_edge():
    t = isoflop_sweep(LAW, [1e19, 1e20], sizes=5, span=0.5, noise=0.0)
    shifted = t.N * np.repeat([1.0, 10 ** 0.45], 5)  # second budget's sizes all above its optimum
    unlabeled = RunTable.from_arrays(shifted, LAW.loss(shifted, t.C / (6 * shifted)), C=t.C)
    assert [len(g) for g in group_budgets(unlabeled)] == [5, 5]
    fit = fit_isoflop(unlabeled)
    assert len(fit.warnings) == 1 and "C=1e+20: minimum at the edge" in fit.warnings[0]
    assert [p.bracketed for p in fit.profiles] == [True, False]


def test_isoflop_single_budget_is_an_error():
    t = isoflop_sweep(LAW, [1e19], sizes=5)
    with pytest.raises(ValueError, match=r"2 or more budgets, got 1 \(C=1e\+19\)"):
        fit_isoflop(t)


def test_envelope_recovers_a_from_curves():
    fit = fit_envelope(isoflop_sweep(LAW, np.logspace(18, 21, 13), sizes=11, span=1.0, noise=0.0, curve_points=60),
                       resamples=200)
    assert fit.allocation.a == pytest.approx(LAW.a, abs=0.02)
    assert fit.stats["a"].se < 0.05
    assert len(np.unique(fit.n_opt)) >= 5


def test_envelope_needs_curves():
    t = RunTable.from_arrays([1e8, 2e8, 4e8], [3.0, 2.9, 2.8], D=[1e9, 1e9, 1e9])
    with pytest.raises(ValueError, match="Approach 1 needs training curves"):
        fit_envelope(t)
