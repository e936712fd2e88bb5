"""Approach 3's cluster bootstrap (`RunTable.group`): runs that share an error are resampled together."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxformer.scaling.bootstrap import bootstrap_parametric, resample_counts
from jaxformer.scaling.parametric import fit_parametric
from jaxformer.scaling.table import RunTable, load_table

CHINCHILLA = Path(__file__).resolve().parents[2] / "shared" / "data" / "chinchilla_svg_extracted.csv"


def test_a_cluster_draw_takes_every_run_of_its_cluster():
    groups = np.array([0, 0, 1, 2, 2, 2])
    counts = resample_counts(6, 50, seed=3, groups=groups)
    clusters = np.random.default_rng(3).multinomial(3, np.full(3, 1 / 3), size=50)
    np.testing.assert_array_equal(counts, clusters[:, groups])
    assert (counts[:, :2].sum(axis=1) == 2 * counts[:, 0]).all()


def test_a_table_listing_every_run_twice_bootstraps_as_the_table_once_when_the_copies_are_a_cluster():
    """Two copies of each run are perfectly correlated: drawn as clusters they carry the evidence of one run (the
    same intervals as the table once); drawn as runs they pretend to twice the evidence (intervals ~1/√2 as wide)."""
    once = load_table(CHINCHILLA).exclude_highest_loss(5)
    n = len(once)
    twice = RunTable.from_arrays(np.tile(once.N, 2), np.tile(once.loss, 2), D=np.tile(once.D, 2))
    clustered = twice.with_groups(np.tile(np.arange(n), 2))
    fit_once = fit_parametric(once)
    fit_twice = fit_parametric(twice)
    assert fit_twice.law.a == pytest.approx(fit_once.law.a, rel=1e-4)
    runs = bootstrap_parametric(once, fit_once, resamples=100, seed=0)
    copies = bootstrap_parametric(twice, fit_twice, resamples=100, seed=0)
    clusters = bootstrap_parametric(clustered, fit_twice, resamples=100, seed=0)
    assert clusters.groups == n and runs.groups is None
    for name in ("alpha", "beta", "E", "a"):
        assert clusters.stats[name].se == pytest.approx(runs.stats[name].se, rel=0.02), name
        assert 1.2 < runs.stats[name].se / copies.stats[name].se < 1.7, name


def test_groups_come_from_columns_of_a_table_file(tmp_path):
    path = tmp_path / "runs.csv"
    rows = [("N", "D", "loss", "seed", "status"), (1e4, 1e6, 2.0, 0, "done"), (1e4, 2e6, 1.9, 0, "done"),
            (1e4, 1e6, 2.01, 1, "done"), (3e4, 1e6, 1.8, 0, "failed"), (3e4, 2e6, 1.7, 0, "done")]
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    table = load_table(path, group_by=["N", "seed"])
    np.testing.assert_array_equal(table.group, [0, 0, 1, 2])  # the failed run is not a row
    group_of = {(n, d, loss): g for n, d, loss, g in zip(table.N, table.D, table.loss, table.group)}
    ordered = table.canonical()  # the fit's order: each run keeps its group (renumbered in that order)
    kept = [group_of[key] for key in zip(ordered.N, ordered.D, ordered.loss)]
    assert [kept.index(g) for g in kept] == [list(ordered.group).index(g) for g in ordered.group]
    assert list(ordered.group) == [list(dict.fromkeys(ordered.group)).index(g) for g in ordered.group]
    np.testing.assert_array_equal(table.subset(np.array([1, 3])).group, [0, 1])
    result = subprocess.run([sys.executable, "-m", "jaxformer.cli", "fit", str(path), "--bootstrap-groups", "N,sede"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "column 'sede' not found" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_sweep_directory_groups_its_runs_by_planned_fields(tmp_path):
    from jaxformer.sweep.table import sweep_table, write_sweep

    table = RunTable.from_arrays([1e4, 1e4, 3e4, 3e4], [2.0, 1.9, 1.8, 1.7], D=[1e6, 2e6, 1e6, 2e6])
    directory = write_sweep(table, tmp_path / "sweep")
    plan = json.loads((directory / "plan.json").read_text())
    for entry, (n, seed) in zip(plan["runs"], [(1e4, 0), (1e4, 0), (3e4, 0), (3e4, 1)]):
        entry.update(N=n, seed=seed)
    (directory / "plan.json").write_text(json.dumps(plan))
    np.testing.assert_array_equal(sweep_table(directory, group_by=["N", "seed"]).group, [0, 0, 1, 2])
    assert sweep_table(directory).group is None
    with pytest.raises(ValueError, match="plan.json's runs have no field 'trunk'"):
        sweep_table(directory, group_by=["trunk"])


def test_a_spec_names_its_bootstrap_groups_among_the_planned_fields(tmp_path):
    import yaml

    from jaxformer.sweep.spec import load_spec

    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "sweeps" / "tiny.yaml").read_text())
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**spec, "fit": {"bootstrap": 10, "bootstrap_groups": ["N", "seed"]}}))
    assert load_spec(path).fit.bootstrap_groups == ["N", "seed"]
    path.write_text(yaml.safe_dump({**spec, "fit": {"bootstrap_groups": ["trunk"]}}))
    with pytest.raises(ValueError, match="fit.bootstrap_groups: 'trunk' is not one of N, N_non_embedding, seed"):
        load_spec(path)


def _listed_twice(table: RunTable) -> RunTable:
    """``table`` with every run (and its training curve) listed a second time."""
    n = len(table)
    twice = RunTable.from_arrays(np.tile(table.N, 2), np.tile(table.loss, 2), D=np.tile(table.D, 2),
                                 C=np.tile(table.C, 2), budget=np.tile(table.budget, 2))
    return twice.with_curves(np.concatenate([table.curve_run, table.curve_run + n]), np.tile(table.curve_tokens, 2),
                             np.tile(table.curve_loss, 2))


def test_approaches_1_and_2_draw_whole_groups_as_approach_3_does():
    """A run's two copies as one group carry one run's evidence: Approach 1's and Approach 2's bootstraps drawing
    groups give the table listed twice exactly the intervals of the table once (each run its own group). Drawn
    run by run, Approach 2 takes the copies as two runs' evidence and narrows a's interval."""
    from jaxformer.scaling.allocation import PRESETS
    from jaxformer.scaling.envelope import fit_envelope
    from jaxformer.scaling.isoflop import fit_isoflop
    from jaxformer.scaling.synthetic import isoflop_sweep

    once = isoflop_sweep(PRESETS["chinchilla"], np.logspace(18, 21, 5), sizes=5, span=0.5, noise=0.005, seed=0)
    twice = _listed_twice(once)
    once_grouped, twice_grouped = once.with_groups(range(len(once))), twice.with_groups(2 * list(range(len(once))))
    approach2 = {name: fit_isoflop(table, resamples=400, seed=0, resample="runs")
                 for name, table in (("once", once_grouped), ("twice", twice_grouped), ("runs", twice))}
    np.testing.assert_allclose(approach2["twice"].samples["a"], approach2["once"].samples["a"], rtol=1e-9)
    assert approach2["runs"].stats["a"].se < 0.85 * approach2["twice"].stats["a"].se
    approach1 = [fit_envelope(table, resamples=200, seed=0).stats["a"] for table in (once_grouped, twice_grouped)]
    assert approach1[0] == approach1[1] and approach1[0].low < approach1[0].high
    residuals = fit_isoflop(twice_grouped, resamples=50, seed=0, resample="residuals")
    assert any("residuals are drawn run by run" in warning for warning in residuals.warnings)
    for table, resample in ((twice, "residuals"), (twice_grouped, "wild"), (twice_grouped, "runs")):  # they do not
        fit = approach2["twice"] if resample == "runs" else fit_isoflop(table, resamples=50, seed=0, resample=resample)
        assert not any("residuals are drawn run by run" in warning for warning in fit.warnings), resample


def test_groups_that_hold_every_run_are_refused_not_drawn_as_zero_width_intervals(tmp_path):
    """One seed grouped by seed (or a grid grouped by budget, which its runs lack) made one group: every resample
    was all the runs, and the fit printed 95% intervals of zero width ('alpha 0.935 [0.935, 0.935]', 'each
    resample draws 1 groups'). The fit now exits 2 naming the cause, and a spec that would do it is refused."""
    import yaml

    from jaxformer.scaling.allocation import PRESETS
    from jaxformer.scaling.synthetic import isoflop_sweep
    from jaxformer.sweep.spec import load_spec

    t = isoflop_sweep(PRESETS["chinchilla"], np.logspace(18, 20, 3), sizes=5, noise=0.002)
    path = tmp_path / "runs.csv"
    path.write_text("N,D,loss,budget,seed\n" + "".join(f"{n},{d},{loss},{b},0\n"
                                                      for n, d, loss, b in zip(t.N, t.D, t.loss, t.budget)))
    message = ("jaxformer fit: error: a bootstrap drawing groups of runs needs 2 or more groups, got 1: every run has "
               "the same value of the grouping columns (fit.bootstrap_groups, --bootstrap-groups)\n")
    for approach in (["--approach", "3"], ["--approach", "2", "--approach2-resample", "wild"]):
        result = subprocess.run([sys.executable, "-m", "jaxformer.cli", "fit", str(path), "--bootstrap", "20",
                                 "--bootstrap-groups", "seed", *approach], capture_output=True, text=True)
        assert result.returncode == 2 and result.stderr == message, result.stderr
    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "sweeps" / "tiny.yaml").read_text())
    one = "fit.bootstrap_groups: every run of this sweep has the same {}, so the runs are one group"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({**spec, "fit": {"bootstrap": 10, "bootstrap_groups": ["seed"]}}))
    with pytest.raises(ValueError, match=one.format("seed")):
        load_spec(spec_path)
    grid = {k: v for k, v in spec.items() if k != "isoflop"} | {"grid": {"params": [8e3, 16e3], "tokens": [1e4, 2e4]}}
    spec_path.write_text(yaml.safe_dump({**grid, "fit": {"bootstrap": 10, "bootstrap_groups": ["budget"]}}))
    with pytest.raises(ValueError, match=one.format("budget")):
        load_spec(spec_path)
    spec_path.write_text(yaml.safe_dump({**grid, "fit": {"bootstrap": 10, "bootstrap_groups": ["N", "budget"]}}))
    assert load_spec(spec_path).fit.bootstrap_groups == ["N", "budget"]  # two sizes: two groups
    counts = resample_counts(4, 200, seed=0, groups=np.array([0, 1, 1, 0]))  # two groups are enough to draw
    assert set(map(tuple, counts)) == {(2, 0, 0, 2), (1, 1, 1, 1), (0, 2, 2, 0)}
