"""The sweep's closing fit on runs that support only some approaches: each approach the runs cannot support is
skipped with its reason and the others stand; when none can be fitted, one line and nothing written."""

import json

import numpy as np

from jaxformer.scaling.allocation import PRESETS
from jaxformer.scaling.synthetic import isoflop_sweep
from jaxformer.sweep.fit import fit_and_write
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
