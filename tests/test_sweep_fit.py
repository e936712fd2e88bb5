"""The sweep's closing fit on runs that support only some approaches: each approach the runs cannot support is
skipped with its reason and the others stand; when none can be fitted, one line and nothing written."""

import json

import numpy as np

from jaxformer.scaling.table import columns_table
from jaxformer.sweep.fit import fit_and_write
from jaxformer.sweep.spec import FitSpec

LAW = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}  # Hoffmann et al.'s Approach-3 law


def _two_sizes_per_budget() -> dict[str, list[float]]:
    """Four budgets, each with two sizes (half and twice 20-tokens-per-parameter's N), losses on the law."""
    columns = {"N": [], "D": [], "C": [], "loss": []}
    for budget in (1e18, 1e19, 1e20, 1e21):
        for factor in (0.5, 2.0):
            n = (budget / 120) ** 0.5 * factor
            d = budget / (6 * n)
            loss = LAW["E"] + LAW["A"] / n ** LAW["alpha"] + LAW["B"] / d ** LAW["beta"]
            for name, value in zip(("N", "D", "C", "loss"), (n, d, budget, loss)):
                columns[name].append(value)
    return columns


def test_an_approach_the_runs_cannot_support_is_skipped_and_the_others_are_fitted_and_written(tmp_path):
    """Two sizes a budget: no IsoFLOP parabola (Approach 2), but eight runs pin Approach 3's law exactly."""
    table = columns_table(_two_sizes_per_budget(), "runs")
    text, report = fit_and_write(table, [], FitSpec(approaches=[2, 3]), tmp_path / "fit")
    assert "note: Approach 2 skipped: Approach 2 needs IsoFLOP profiles (3+ sizes) at 2 or more budgets, got 0" in text
    assert "budget C=1e+18: 2 distinct sizes, need 3 for a parabola" in text
    assert report.approach2 is None
    fitted = json.loads((tmp_path / "fit" / "fit.json").read_text())
    for name, value in LAW.items():
        assert abs(fitted["approach3"]["params"][name] / value - 1) < 1e-4, (name, fitted["approach3"]["params"])
    assert "approach2" not in fitted and fitted["notes"] == [text.split("note: ")[1].splitlines()[0]]
    a = LAW["beta"] / (LAW["alpha"] + LAW["beta"])
    allocation = fitted["allocation"]["Approach 3"]
    n_opt, flops = (np.log([row[key] for row in allocation]) for key in ("N_opt", "flops"))
    np.testing.assert_allclose(np.diff(n_opt) / np.diff(flops), a, rtol=1e-4)  # N_opt ∝ C^a, a = β / (α + β)
    assert list(fitted["allocation"]) == ["Approach 3"]


def test_runs_that_support_no_approach_give_one_line_with_each_reason_and_write_nothing(tmp_path):
    columns = {name: values[:2] for name, values in _two_sizes_per_budget().items()}
    text, report = fit_and_write(columns_table(columns, "runs"), [{}, {}], FitSpec(approaches=[2, 3]),
                                 tmp_path / "fit")
    assert report is None and not (tmp_path / "fit").exists()
    assert text.startswith("fit skipped (2 finished runs): Approach 3 skipped: Approach 3 needs more runs than its 5 "
                           "parameters, got 2; Approach 2 skipped: Approach 2 needs IsoFLOP profiles")
    assert len(text.splitlines()) == 1
