"""Approach 1 (the loss envelope of training curves): the law recovered, unbracketed optima left out, and each
bootstrap resample equal to the point fit on the runs it drew."""

import numpy as np
import pytest

from jaxformer.scaling.allocation import PRESETS
from jaxformer.scaling.bootstrap import resample_counts
from jaxformer.scaling.envelope import fit_envelope
from jaxformer.scaling.synthetic import isoflop_sweep
from jaxformer.scaling.table import RunTable

LAW = PRESETS["chinchilla"]  # a = 0.4516


def one_budget(fractions, C: float = 1e19, points: int = 60) -> RunTable:
    """Runs of ``fractions`` × N_opt(C) at one budget C, each with the law's noiseless curve from 1% of its D to D:
    every run's curve spans the same FLOPs (C/100 to C), so any subset of them has the same envelope grid."""
    N = LAW.n_opt(C) * np.asarray(fractions)
    D = C / (6 * N)
    run = np.repeat(np.arange(len(N)), points)
    tokens = (D[:, None] * np.geomspace(0.01, 1.0, points)[None]).ravel()
    loss = LAW.loss(N[run], tokens)
    return RunTable.from_arrays(N, loss[points - 1::points], D=D, C=np.full(len(N), C)).with_curves(run, tokens, loss)


def test_envelope_recovers_a_from_curves():
    table = isoflop_sweep(LAW, np.logspace(18, 21, 13), sizes=11, span=1.0, noise=0.0, curve_points=60)
    fit = fit_envelope(table, resamples=200)
    assert fit.allocation.a == pytest.approx(LAW.a, abs=0.02)
    assert fit.stats["a"].se < 0.05
    assert len(np.unique(fit.n_opt)) >= 5
    # the smallest run is best at the lowest of the 250 FLOP values, an optimum not bracketed: left out
    assert len(fit.flops) == 249 and table.N.min() < fit.n_opt.min()


def test_the_envelope_leaves_out_flops_where_the_largest_run_is_best_and_two_sizes_fit():
    """Four sizes (0.05, 0.2, 0.5 and 1 x N_opt): the largest run is best over the top 42 of the 250 FLOP values,
    the smallest nowhere, so the envelope holds the two middle sizes over 208 values, and two sizes are enough for
    its power laws."""
    table = one_budget([0.05, 0.2, 0.5, 1.0])
    fit = fit_envelope(table)
    assert len(fit.flops) == 208 and np.array_equal(np.unique(fit.n_opt), table.N[1:3])
    assert fit.to_dict()["sizes_on_envelope"] == 2 and np.isfinite(fit.allocation.a)


def test_each_resample_is_the_point_fit_of_the_runs_it_drew():
    """Six sizes, 300 resamples: a resample's power law (a, k_N) is the envelope fit of its drawn runs alone, and
    NaN where that fit is refused (under 2 sizes on its envelope: 99 of them). Those gave a = 0 (a line through
    one size), which put the 95% interval's low end at 0 instead of 0.20."""
    table = one_budget(np.geomspace(0.05, 1.0, 6))
    fit = fit_envelope(table, resamples=300, seed=3)
    expected = []
    for counts in resample_counts(len(table), 300, 3):
        try:
            law = fit_envelope(table.subset(np.flatnonzero(counts > 0))).allocation
            expected.append((law.a, law.k_N))
        except ValueError:  # "needs at least 2 model sizes on the loss envelope"
            expected.append((np.nan, np.nan))
    np.testing.assert_allclose(np.stack([fit.samples["a"], fit.samples["k_N"]], 1), expected, rtol=1e-9, atol=0)
    assert np.isnan(expected).sum() == 2 * 99
    assert fit.stats["a"].low == pytest.approx(0.2028, abs=1e-4) and fit.stats["a"].value == pytest.approx(0.4027,
                                                                                                          abs=1e-4)


def test_envelope_needs_curves():
    t = RunTable.from_arrays([1e8, 2e8, 4e8], [3.0, 2.9, 2.8], D=[1e9, 1e9, 1e9])
    with pytest.raises(ValueError, match="Approach 1 needs training curves"):
        fit_envelope(t)
