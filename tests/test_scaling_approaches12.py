"""Approaches 1 and 2 recover the exponent of a known law from synthetic sweeps."""

import warnings

import numpy as np
import pytest

from jaxformer.scaling.allocation import PRESETS
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
    for p in fit.profiles:  # each minimum lands on the law's optimum, its loss the parabola's least
        assert p.n_opt == pytest.approx(float(LAW.n_opt(p.budget)), rel=0.1)
        assert p.loss_opt == pytest.approx(float(p.curve(p.n_opt)), rel=1e-12)
        assert p.loss_opt == pytest.approx(float(LAW.loss_opt(p.budget)), rel=2e-3)
        assert p.bracketed
    assert fit.warnings == []
    np.testing.assert_allclose(fit.allocation.d_opt(BUDGETS) * fit.allocation.n_opt(BUDGETS) * 6, BUDGETS)


def test_isoflop_groups_by_c_without_labels_and_warns_at_the_edge():
    t = isoflop_sweep(LAW, [1e19, 1e20], sizes=5, span=0.5, noise=0.0)
    shifted = t.N * np.repeat([1.0, 10 ** 0.45], 5)  # second budget's sizes all above its optimum
    unlabeled = RunTable.from_arrays(shifted, LAW.loss(shifted, t.C / (6 * shifted)), C=t.C)
    assert [len(g) for g in group_budgets(unlabeled)] == [5, 5]
    # C within 10% of a group's smallest joins it (12% above does not); a budget of one run is a group of its own
    C = np.array([1e20, 1.05e19, 1e19, 1.12e19, 3e18])
    groups = group_budgets(RunTable.from_arrays(np.full(5, 1e8), np.full(5, 3.0), C=C))
    assert [g.tolist() for g in groups] == [[4], [1, 2], [3], [0]]
    near = isoflop_sweep(LAW, [1e19, 1.12e19], sizes=5, span=0.5, noise=0.0)  # two budgets, fitted apart
    near = RunTable.from_arrays(near.N, near.loss, C=near.C)
    assert [p.budget for p in fit_isoflop(near).profiles] == pytest.approx([1e19, 1.12e19])
    fit = fit_isoflop(unlabeled, keep_edges=True)
    assert len(fit.warnings) == 1 and "C=1e+20: minimum at the edge" in fit.warnings[0]
    assert [p.bracketed for p in fit.profiles] == [True, False]
    with pytest.raises(ValueError, match=r"got 1 \(C=1e\+19\); budget C=1e\+20: minimum at the edge .* left out"):
        fit_isoflop(unlabeled)


def test_approach_2_says_why_no_budget_gave_a_profile():
    """A sweep whose loss rises with N at every budget, more slowly at larger N (parabolas opening downward), used
    to be refused with "got 0 (none)" alone; each budget's reason is named."""
    N = np.array([8240.0, 16496.0, 34976.0] * 2)
    C = np.repeat([1e9, 2e9], 3)
    loss = np.array([3.144, 4.232, 4.429, 2.324, 3.315, 3.654])  # a CPU run of experiments/gpu_check/tiny_fit.yaml
    table = RunTable.from_arrays(N, loss, C=C, budget=C)
    with pytest.raises(ValueError, match=r"got 0 \(none\); budget C=1e\+09: the parabola opens downward \(no minimum\); "
                                         r"skipped; budget C=2e\+09: the parabola opens downward"):
        fit_isoflop(table)
    with pytest.raises(ValueError, match=r"got 0 \(none\); budget C=1e\+09: 2 distinct sizes, need 3"):
        fit_isoflop(RunTable.from_arrays(N[[0, 1, 3, 4]], loss[[0, 1, 3, 4]], C=C[[0, 1, 3, 4]], budget=C[[0, 1, 3, 4]]))


def test_edge_minima_are_left_out_of_the_power_laws():
    """A budget whose sizes all lie above its optimum would drag a; by default its minimum is drawn, not fitted."""
    t = isoflop_sweep(LAW, BUDGETS, noise=0.0)
    last = t.budget == BUDGETS[-1]
    shifted = np.where(last, t.N * 10 ** 1.0, t.N)
    edge = RunTable.from_arrays(shifted, LAW.loss(shifted, t.C / (6 * shifted)), C=t.C, budget=t.budget)
    fit, kept = fit_isoflop(edge), fit_isoflop(edge, keep_edges=True)
    assert [p.bracketed for p in fit.profiles] == [True] * (len(BUDGETS) - 1) + [False]
    assert "left out of the power laws" in fit.warnings[0] and "kept" in kept.warnings[0]
    assert fit.allocation.a == pytest.approx(LAW.a, abs=0.01)  # the bracketed budgets alone recover the law
    assert abs(kept.allocation.a - LAW.a) > 3 * abs(fit.allocation.a - LAW.a)  # the edge minimum, kept, pulls it off


def test_isoflop_single_budget_is_an_error():
    t = isoflop_sweep(LAW, [1e19], sizes=5)
    with pytest.raises(ValueError, match=r"2 or more budgets, got 1 \(C=1e\+19\)"):
        fit_isoflop(t)


def test_all_approaches_on_runs_without_budgets_or_curves_fit_approach_3_and_say_why_not_the_others():
    from jaxformer.scaling.report import fit_table

    N, D = np.repeat(np.geomspace(1e7, 1e9, 6), 3), np.tile(np.geomspace(1e9, 1e11, 3), 6)
    report = fit_table(RunTable.from_arrays(N, LAW.loss(N, D), D=D), "all", resamples=0)
    assert report.approach3 is not None and report.approach2 is None and report.approach1 is None
    assert report.notes == ["Approach 2 skipped: the runs carry no IsoFLOP budget labels (use --approach 2 to group "
                            "them by C)", "Approach 1 skipped: the runs carry no training curves"]


def test_frontier_bands_hold_each_law_and_widen_beyond_the_data():
    """The shaded N_opt bands of the plot: percentiles over each approach's bootstrap laws (the synthetic sweep has
    training curves, so Approach 1 has resampled laws too)."""
    from jaxformer.scaling.report import fit_table

    report = fit_table(isoflop_sweep(LAW, BUDGETS, noise=0.002), "all", resamples=100, seed=0)
    C = np.geomspace(1e18, 1e25, 8)
    bands = report.frontier_bands(C)
    assert set(bands) == {"Approach 1", "Approach 2", "Approach 3"}
    for label, (low, high) in bands.items():
        n_opt = report.laws()[label].n_opt(C)
        assert np.all(low < n_opt) and np.all(n_opt < high), label
        inside, beyond = high[1] / low[1], high[-1] / low[-1]  # 1e19 (in the data) and 1e25 (extrapolated)
        assert 1 < inside < beyond, label
    for label, fit in (("Approach 2", report.approach2), ("Approach 1", report.approach1)):
        s = fit.samples
        expected = np.nanpercentile(s["k_N"] * 1e25 ** s["a"], [2.5, 97.5])
        assert (bands[label][0][-1], bands[label][1][-1]) == pytest.approx(tuple(expected)), label


def test_frontier_bands_take_an_overflowing_resample_without_a_warning():
    """Approach 2 on a few noisy budgets can resample a far from the fit (a = 0.68 [-0.09, 3.1] in
    experiments/quick_min2_icx): its N_opt overflows at large C, which is an open band, not a warning."""
    from jaxformer.scaling.report import fit_table

    report = fit_table(isoflop_sweep(LAW, BUDGETS, noise=0.002), "2", resamples=100, seed=0)
    report.approach2.samples["a"][0] = 40.0  # 1e25 ** 40 overflows float64
    report.approach2.samples["a"][1], report.approach2.samples["k_N"][1] = -40.0, np.inf  # inf · 1e25 ** -40 = NaN
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low, high = report.frontier_bands(np.geomspace(1e18, 1e25, 8))["Approach 2"]
    assert np.all(np.isfinite(low)) and np.all(np.isfinite(high))  # two of 100 resamples stay outside 95%


def test_an_approach_2_bootstrap_that_kept_no_resample_draws_no_band(tmp_path):
    """Three sizes at each of two budgets: a resample of runs rarely holds all three sizes of both, so ten
    resamples kept none. The N_opt figure then shades Approaches 3 and 1 alone (np.nanpercentile of no rows gave one
    array of K, which fill_between took as K arguments: the sweep's closing fit failed with a TypeError)."""
    from jaxformer.scaling.report import fit_table

    report = fit_table(isoflop_sweep(LAW, [1e19, 1e20], sizes=3, span=0.3), "all", resamples=10, seed=0)
    assert report.approach2.samples["a"].shape == (0,)
    assert "bootstrap: 0 of 10 resamples kept" in report.approach2.warnings[-1]
    bands = report.frontier_bands(np.geomspace(1e18, 1e21, 5))
    assert list(bands) == ["Approach 3", "Approach 1"] and bands["Approach 3"][0].shape == (5,)
    for name in ("a", "k_N"):  # as if no resample had two sizes on its envelope: no band, and no numpy warning
        report.approach1.samples[name][:] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(report.frontier_bands(np.geomspace(1e18, 1e21, 5))) == ["Approach 3"]
    paths = report.write_plots(tmp_path)
    assert (tmp_path / "n_opt.png").stat().st_size > 0 and len(paths) == 8


def test_approaches_without_an_interval_are_not_said_to_disagree():
    """Approach 2's ten resamples of a 2 x 3 study kept none, so its interval for a is NaN: the report says their
    agreement is not assessed (it said they 'disagree: their 95% intervals for a, [nan, nan] and [...]')."""
    from jaxformer.scaling.report import fit_table

    report = fit_table(isoflop_sweep(LAW, [1e19, 1e20], sizes=3, span=0.3), "all", resamples=10, seed=0)
    found = report.agreement()
    assert found["agree"] is None and found["interval2"] is None
    low, high = found["interval3"]
    assert low < report.approach3.law.a < high
    assert report.agreement_text() == (f"a = {report.approach2.allocation.a:.3f} (Approach 2) and "
                                       f"{report.approach3.law.a:.3f} (Approach 3); no bootstrap interval for "
                                       "Approach 2, so their agreement is not assessed")
    assert report.to_dict()["agreement"]["agree"] is None


def test_resampled_allocations_equal_the_law_through_each_resamples_optima():
    """`sample_allocations` (all resamples as one allocation of arrays) against `allocation_from_optima` run on
    each resample's optima alone, with exact-FLOPs compute per token (k = 23, p = 0.91)."""
    from jaxformer.scaling.allocation import FlopsPerToken
    from jaxformer.scaling.powerlaw import allocation_from_optima, power_law_samples, sample_allocations

    rng = np.random.default_rng(0)
    C, flops = np.geomspace(1e11, 1e13, 9), FlopsPerToken(k=23.16, p=0.91)
    optima = 0.0018 * C**0.61 * np.exp(rng.normal(0, 0.05, (20, 9)))
    many = sample_allocations(power_law_samples(C, optima, flops), flops)
    budgets = np.array([3e10, 3e13, 1e15])
    for i, row in enumerate(optima):
        one = allocation_from_optima(C, row, np.ones_like(row), flops)
        np.testing.assert_allclose(many.n_opt(budgets)[i], one.n_opt(budgets), rtol=1e-12)
        np.testing.assert_allclose(many.d_opt(budgets)[i], one.d_opt(budgets), rtol=1e-12)


def test_a_degenerate_resample_is_an_open_interval_not_a_warning():
    """The Ice Lake beta2 study's nine budgets (experiments/cpu_chinchilla_ladder_beta2_icx), every minimum kept
    (``keep_edges``): one of the 1,000 residual resamples of seed 0 puts a budget's minimum so far beyond its sizes
    that the power law's intercept leaves float64 (the sweep once printed an overflow warning); k_N's interval is
    then open above, silently. With the edge rule (the default) no resample keeps such a minimum."""
    from pathlib import Path

    from jaxformer.scaling.table import load_table

    study = Path(__file__).resolve().parents[1] / "experiments" / "cpu_chinchilla_ladder_beta2_icx" / "results.csv"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = fit_isoflop(load_table(study).canonical(), resamples=1000, seed=0, resample="residuals", keep_edges=True)
        fit = fit_isoflop(load_table(study).canonical(), resamples=1000, seed=0, resample="residuals")
    assert np.isinf(kept.samples["k_N"]).sum() >= 1
    assert kept.stats["a"].low == pytest.approx(0.3262, abs=1e-4) and kept.stats["a"].high == pytest.approx(0.6679, abs=1e-4)
    assert np.isinf(fit.samples["k_N"]).sum() == 0
    assert fit.stats["a"].low == pytest.approx(0.5262, abs=1e-4) and fit.stats["a"].high == pytest.approx(0.6704, abs=1e-4)


def test_each_resample_takes_a_minimum_only_where_its_sizes_bracket_it():
    """The point fit leaves out a budget whose minimum its sizes do not bracket; each bootstrap resample does the
    same with the sizes it drew. Five sizes within 3.2x of the optimum at seven budgets, 0.5% noise: the resamples
    that count keep every budget's N_opt inside its sizes, and drawing runs gives a's interval [0.387, 0.505] (1,996
    resamples kept), where keeping the resamples' extrapolated minima gave [-0.03, 0.61] (821 of 2,000 left)."""
    table = isoflop_sweep(LAW, BUDGETS, sizes=5, span=0.5, noise=0.005, seed=0)
    fit = fit_isoflop(table, resamples=2000, seed=0, resample="runs")
    for p in fit.profiles:
        if p.bracketed:
            n_opt = fit.samples[f"N_opt@{p.budget:.3g}"]
            n_opt = n_opt[np.isfinite(n_opt)]
            assert n_opt.size > 1000 and np.all((p.N.min() < n_opt) & (n_opt < p.N.max()))
    low, high = fit.stats["a"].low, fit.stats["a"].high
    assert low < LAW.a < high and 0.1 < high - low < 0.3
    kept = len(fit.samples["a"])  # the resamples with two or more bracketed minima, said in a warning when not all
    assert (kept < 2000) == any(w.startswith(f"bootstrap: {kept} of 2000 resamples kept") for w in fit.warnings)


def test_residual_bootstrap_matches_the_spread_over_repeated_studies():
    """Five sizes per budget, as a small study has: over 20 studies, the fixed-design (residual) bootstrap's 95%
    interval on a is about as wide as the spread of a over 200 independent repetitions of the study, and covers
    the true a about 95% of the time; drawing runs makes it several times too wide."""
    def study(seed):
        return isoflop_sweep(LAW, BUDGETS[::2], sizes=5, span=0.5, noise=0.003, seed=seed)

    low, high = np.percentile([fit_isoflop(study(s), keep_edges=True).allocation.a for s in range(100, 300)], [2.5, 97.5])
    widths, covered = {"residuals": [], "runs": []}, 0
    for seed in range(20):
        for resample in widths:
            a = fit_isoflop(study(seed), resamples=1000, seed=seed, keep_edges=True, resample=resample).stats["a"]
            widths[resample].append((a.high - a.low) / (high - low))
            covered += resample == "residuals" and a.low < LAW.a < a.high
    assert 0.7 < np.median(widths["residuals"]) < 1.5, widths["residuals"]
    assert np.median(widths["runs"]) > 2 * np.median(widths["residuals"])
    assert covered >= 16
    with pytest.raises(ValueError, match="runs, residuals, wild"):
        fit_isoflop(study(0), resamples=10, resample="seeds")


def _heteroscedastic_study(seed: int, noise: np.ndarray) -> RunTable:
    """Five sizes per budget as a small study has, each budget with its own log-normal scatter ``noise[k]``."""
    t = isoflop_sweep(LAW, BUDGETS[::2], sizes=5, span=0.5, noise=0.0, seed=seed)
    scatter = np.repeat(noise, 5) * np.random.default_rng(seed).standard_normal(len(t))
    return RunTable.from_arrays(t.N, t.loss * np.exp(scatter), D=t.D, C=t.C, budget=t.budget)


def test_wild_bootstrap_keeps_each_budgets_own_scatter():
    """Scatter 1% at the smallest budget and 0.1% at the others: the pooled residual bootstrap gives every budget the
    pooled size, the wild bootstrap each its own. Over 20 studies the wild interval on a is about as wide as a's
    spread over 200 repetitions, where the pooled one is well over 1.5 times that. It covers the true a less often
    than 95%: 75% over 60 studies (two residual degrees of freedom per budget leave some intervals too narrow)."""
    noise = np.array([0.01, 0.001, 0.001, 0.001])
    low, high = np.percentile([fit_isoflop(_heteroscedastic_study(s, noise), keep_edges=True).allocation.a
                               for s in range(100, 300)], [2.5, 97.5])
    widths, covered = {"residuals": [], "wild": []}, 0
    for seed in range(20):
        study = _heteroscedastic_study(seed, noise)
        for resample in widths:
            fit = fit_isoflop(study, resamples=1000, seed=seed, keep_edges=True, resample=resample)
            widths[resample].append((fit.stats["a"].high - fit.stats["a"].low) / (high - low))
            covered += resample == "wild" and fit.stats["a"].low < LAW.a < fit.stats["a"].high
        quiet = f"N_opt@{study.budget[-1]:.3g}"
        wild_quiet = fit.stats[quiet]
        pooled_quiet = fit_isoflop(study, resamples=1000, seed=seed, keep_edges=True, resample="residuals").stats[quiet]
        assert wild_quiet.high - wild_quiet.low < 0.5 * (pooled_quiet.high - pooled_quiet.low)
    assert 0.6 < np.median(widths["wild"]) < 1.6, widths["wild"]
    assert np.median(widths["residuals"]) > 1.5 * np.median(widths["wild"])
    assert covered >= 12


def test_wild_bootstrap_draws_one_sign_per_group():
    """Two budgets with the same sizes and the same residuals (the second's losses the first's plus a constant):
    with each size one group, as a WSD trunk serving both budgets is, every resample moves both minima alike;
    with a sign per run they move apart. Losses exactly on a parabola leave no residual: the interval is the point."""
    t = isoflop_sweep(LAW, [1e19], sizes=5, span=0.5, noise=0.0)
    wobble = np.array([0.004, -0.003, 0.001, 0.002, -0.004])
    N, loss = np.tile(t.N, 2), np.concatenate([t.loss + wobble, t.loss + wobble - 0.1])
    budget = np.repeat([1e19, 2e19], 5)
    table = RunTable.from_arrays(N, loss, D=np.tile(t.D, 2), C=budget, budget=budget)
    grouped = fit_isoflop(table.with_groups(N), resamples=200, seed=0, resample="wild", keep_edges=True)
    np.testing.assert_allclose(grouped.samples["N_opt@1e+19"], grouped.samples["N_opt@2e+19"], rtol=1e-9)
    single = fit_isoflop(table, resamples=200, seed=0, resample="wild", keep_edges=True)
    assert np.mean(np.isclose(single.samples["N_opt@1e+19"], single.samples["N_opt@2e+19"], rtol=1e-9)) < 0.1
    parabola = 2.0 + 0.05 * (np.log(N) - np.log(t.N[1])) ** 2  # minimum at the second size
    exact = RunTable.from_arrays(N, parabola, D=np.tile(t.D, 2), C=budget, budget=budget)
    n_opt = fit_isoflop(exact, resamples=50, seed=0, resample="wild", keep_edges=True).stats["N_opt@1e+19"]
    assert n_opt.value == pytest.approx(t.N[1], rel=1e-9)
    assert n_opt.low == pytest.approx(n_opt.value, rel=1e-9) and n_opt.high == pytest.approx(n_opt.value, rel=1e-9)



@pytest.fixture(scope="module")
def both_fitted():
    """Approaches 2 and 3, 20 resamples each, on the Chinchilla law's sweep; tests change copies of it."""
    from jaxformer.scaling.report import fit_table

    return fit_table(isoflop_sweep(LAW, BUDGETS, noise=0.002), "all", resamples=20, seed=0)


def _with_intervals(report, approach2=None, approach3=None):
    """A copy of ``report`` whose bootstrap intervals are replaced where given (``{name: Interval}``)."""
    import copy
    import dataclasses

    changed = copy.copy(report)
    if approach2:
        changed.approach2 = dataclasses.replace(report.approach2, stats={**report.approach2.stats, **approach2})
    if approach3:
        changed.bootstrap3 = dataclasses.replace(report.bootstrap3, stats={**report.bootstrap3.stats, **approach3})
    return changed


def test_the_report_names_each_point_estimate_outside_its_own_interval(both_fitted):
    """What `jaxformer fit` warns of (tests/test_scaling_cli.py checks the line with this list replaced): none on a
    law's own sweep, and each interval that misses its point, Approach 3 first."""
    from jaxformer.scaling.bootstrap import Interval

    assert both_fitted.outside_intervals() == []
    changed = _with_intervals(both_fitted, approach2={"a": Interval(0.381, 2e-7, 1.5, 1.5)},
                              approach3={"E": Interval(1.4, 1e-3, 1.5, 1.6),
                                         "alpha": Interval(0.34, 1e-3, 0.33, 0.35)})  # inside: not named
    assert changed.outside_intervals() == ["Approach 3: E 1.4 [1.5, 1.6]", "Approach 2: a 0.381 [1.5, 1.5]"]


def test_approaches_2_and_3_agree_where_their_intervals_for_a_overlap(both_fitted):
    """Both recover the law's a (0.4516), so their intervals overlap; intervals apart disagree; intervals that
    share an end point overlap."""
    from jaxformer.scaling.bootstrap import Interval

    found = both_fitted.agreement()
    (low2, high2), (low3, high3) = found["interval2"], found["interval3"]
    assert low2 < LAW.a < high2 and low3 < LAW.a < high3 and found["agree"] is True
    assert both_fitted.agreement_text().startswith(
        f"Approaches 2 and 3 agree: their 95% intervals for a, [{low2:.3f}, {high2:.3f}] and [{low3:.3f}, "
        f"{high3:.3f}], overlap (a = ")
    apart = _with_intervals(both_fitted, approach2={"a": Interval(0.6, 0.01, high3 + 0.01, high3 + 0.1)})
    assert apart.agreement()["agree"] is False
    assert "disagree: their 95% intervals for a" in apart.agreement_text() and "do not overlap" in apart.agreement_text()
    below = _with_intervals(both_fitted, approach3={"a": Interval(0.3, 0.01, low2 - 0.1, low2 - 0.01)})
    assert below.agreement()["agree"] is False
    touching = _with_intervals(both_fitted, approach2={"a": Interval(0.6, 0.01, high3, high3 + 0.1)})
    assert touching.agreement()["agree"] is True
    straddling = _with_intervals(both_fitted, approach3={"a": Interval(0.5, 0.01, (low2 + high2) / 2, high2 + 0.1)})
    assert straddling.agreement()["agree"] is True  # Approach 3's reaches past Approach 2's upper end
