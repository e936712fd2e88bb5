"""The sweep's closing fit: an approach the runs cannot support is skipped with its reason and the others stand
(when none can be fitted: one line, nothing written); the approaches kept side by side, the allocation's
budgets, and the seed-noise line."""

import json

import numpy as np
import pytest

from jaxformer.scaling.allocation import PRESETS
from jaxformer.scaling.synthetic import isoflop_sweep
from jaxformer.sweep.fit import fit_and_write, pooled_seed_noise, seed_noise, seed_spreads
from jaxformer.sweep.spec import FitSpec

LAW = PRESETS["chinchilla"]  # Hoffmann et al.'s Approach-3 law


def test_an_approach_the_runs_cannot_support_is_skipped_and_the_others_are_fitted_and_written(tmp_path):
    """Two sizes a budget: no IsoFLOP parabola (Approach 2), but eight runs pin Approach 3's law exactly."""
    table = isoflop_sweep(LAW, [1e18, 1e19, 1e20, 1e21], sizes=2, noise=0.0)
    text, report = fit_and_write(table, [], FitSpec(approaches=[2, 3]), tmp_path / "fit")
    assert "note: Approach 2 skipped: Approach 2 needs IsoFLOP profiles (3+ sizes) at 2 or more budgets, got 0" in text
    assert "budget C=1e+18: 2 distinct sizes, need 3 for a parabola" in text
    assert report.approach2 is None
    fitted = json.loads((tmp_path / "fit" / "fit.json").read_text())
    for name, value in LAW.to_dict().items():
        assert abs(fitted["approach3"]["params"][name] / value - 1) < 1e-4, (name, fitted["approach3"]["params"])
    assert "approach2" not in fitted and fitted["notes"] == [text.split("note: ")[1].splitlines()[0]]
    a = LAW.beta / (LAW.alpha + LAW.beta)
    allocation = fitted["allocation"]["Approach 3"]
    n_opt, flops = (np.log([row[key] for row in allocation]) for key in ("N_opt", "flops"))
    np.testing.assert_allclose(np.diff(n_opt) / np.diff(flops), a, rtol=1e-4)  # N_opt ∝ C^a, a = β / (α + β)
    assert list(fitted["allocation"]) == ["Approach 3"]


def test_runs_that_support_no_approach_give_one_line_with_each_reason_and_write_nothing(tmp_path):
    table = isoflop_sweep(LAW, [1e18], sizes=2, noise=0.0)  # two runs
    text, report = fit_and_write(table, [{}, {}], FitSpec(approaches=[2, 3]), tmp_path / "fit")
    assert report is None and not (tmp_path / "fit").exists()
    assert text.startswith("fit skipped (2 finished runs): Approach 3 skipped: Approach 3 needs more runs than its 5 "
                           "parameters, got 2; Approach 2 skipped: Approach 2 needs IsoFLOP profiles")
    assert len(text.splitlines()) == 1


def test_both_approaches_are_kept_with_their_bootstrap_and_the_allocation_spans_a_hundredfold_beyond(tmp_path):
    """Five sizes at each of four budgets support both approaches; the report keeps each (and Approach 3's
    bootstrap), and the allocation table runs over five budgets from the smallest to 100× the largest."""
    table = isoflop_sweep(LAW, [1e18, 1e19, 1e20, 1e21], sizes=5, noise=0.0)
    text, report = fit_and_write(table, [], FitSpec(approaches=[2, 3], bootstrap=20), tmp_path / "fit")
    assert report.approach2 is not None and report.approach3 is not None and report.bootstrap3 is not None
    fitted = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert list(fitted["allocation"]) == ["Approach 2", "Approach 3"]
    for rows in fitted["allocation"].values():
        np.testing.assert_allclose([row["flops"] for row in rows], np.geomspace(table.C.min(), 100 * table.C.max(), 5),
                                   rtol=1e-12)
    first = fitted["allocation"]["Approach 3"][0]
    assert (f"  {'Approach 3':<12}{first['flops']:>12.3g}{first['N_opt']:>12.4g}{first['D_opt']:>12.4g}"
            f"{first['tokens_per_param']:>8.1f}{first['loss']:>8.3f}") in text.splitlines()


def test_the_seed_noise_line_pools_the_shapes_and_names_their_median_and_largest_spread():
    """Two shapes trained with two seeds each: relative spreads s of 1% and 3% of the mean (one degree of freedom
    each), pooled as sqrt((s1² + s2²) / 2); a shape with one seed and an unfinished run add nothing."""
    half = 2 ** -0.5  # two values m ± s·m/√2 have standard deviation s·m
    rows = [{"status": "done", "N": 1, "D": 10, "loss": 2.0 + sign * 0.02 * half} for sign in (-1, 1)]
    rows += [{"status": "done", "N": 2, "D": 10, "loss": 1.0 + sign * 0.03 * half} for sign in (-1, 1)]
    rows += [{"status": "done", "N": 3, "D": 10, "loss": 1.5}, {"status": "failed", "N": 1, "D": 10, "loss": None}]
    assert seed_spreads(rows) == pytest.approx([0.01, 0.03], rel=1e-12)
    assert pooled_seed_noise(rows) == (pytest.approx((0.0005) ** 0.5, rel=1e-12), 2)
    assert seed_noise(rows) == ("seed noise: 2 shapes trained with several seeds; the final loss's standard deviation "
                                "across seeds is 2.24% of its mean (pooled over the shapes, 2 degrees of freedom; "
                                "median 2.00%, largest 3.00%)")
