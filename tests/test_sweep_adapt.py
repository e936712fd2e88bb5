"""Grids that bracket (``isoflop.adapt``): sizes added beyond the edge where a budget's minimum lies, on a known
law and in a real sweep; the spec's checks; the relaunch of an adapted sweep."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from jaxformer.scaling.allocation import PRESETS
from jaxformer.scaling.isoflop import fit_isoflop, minimum_edge
from jaxformer.scaling.table import RunTable
from jaxformer.sweep.adapt import BudgetState, adapt, next_size
from jaxformer.sweep.launch import LaunchOptions, launch, plan_table
from jaxformer.sweep.plan import plan_runs
from jaxformer.sweep.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
LAW = PRESETS["chinchilla"]
STEP = 2.0  # neighbouring sizes a factor 2 apart (span 16 over 5 sizes)


def _loss(N: float, C: float) -> float:
    return float(LAW.loss(N, C / (6 * N)))


def _state(C: float, multiples: list[float]) -> BudgetState:
    """Budget C with sizes at ``multiples`` of the law's N_opt(C), each "trained" to the law's loss."""
    targets = [float(LAW.n_opt(C)) * m for m in multiples]
    return BudgetState(C, targets, [(n, _loss(n, C)) for n in targets])


def _train_on_the_law(proposals):
    return {p: [(p.target, _loss(p.target, p.budget))] for p in proposals}


def _table(states: list[BudgetState]) -> RunTable:
    N = np.array([n for s in states for n, _ in s.points])
    loss = np.array([l for s in states for _, l in s.points])
    budget = np.array([s.budget for s in states for _ in s.points])
    return RunTable.from_arrays(N, loss, D=budget / (6 * N), C=budget, budget=budget, source="synthetic")


def test_an_adaptive_sweep_on_a_known_law_adds_sizes_until_each_minimum_is_bracketed():
    """Sizes all below N_opt at one budget and all above at the other: three sizes each, beyond the edge, bracket
    both minima (the law's profile in ln(N / N_opt) is the same at every budget, so the counts agree)."""
    below, above = _state(1e21, [2.0**k for k in range(-6, -1)]), _state(1e22, [2.0**k for k in range(2, 7)])
    with pytest.raises(ValueError, match="got 0"):  # as planned, Approach 2 has no bracketed budget
        fit_isoflop(_table([below, above]))
    lines = []
    adapt([below, above], step=STEP, limit=5, train=_train_on_the_law, report=lines.append)
    assert [s.outcome for s in (below, above)] == ["bracketed", "bracketed"]
    assert below.added == above.added == 3
    assert np.array(below.targets[5:]) / float(LAW.n_opt(1e21)) == pytest.approx([0.5, 1.0, 2.0])
    assert np.array(above.targets[5:]) / float(LAW.n_opt(1e22)) == pytest.approx([2.0, 1.0, 0.5])
    for state in (below, above):  # the lowest loss is now inside the sizes, at N_opt
        N = np.array([n for n, _ in state.points])
        lowest = N[np.argmin([l for _, l in state.points])]
        assert N.min() < lowest < N.max() and lowest == pytest.approx(float(LAW.n_opt(state.budget)))
    fit = fit_isoflop(_table([below, above]))
    assert all(p.bracketed for p in fit.profiles) and fit.warnings == []
    n_top = float(LAW.n_opt(1e21)) / 4
    assert lines[0] == f"adapt: C=1e+21 minimum at the upper edge (N={n_top:,.0f}); adding N≈{2 * n_top:.2g}"
    assert lines[1].startswith("adapt: C=1e+22 minimum at the lower edge")
    assert len(lines) == 3 * 2 + 1  # one line per size added, then the closing line
    assert lines[-1] == "adapt: minimum bracketed: C=1e+21 (3 added), C=1e+22 (3 added)"


def test_the_limit_stops_an_adaptive_sweep_and_is_reported():
    state = _state(1e21, [2.0**k for k in range(-6, -1)])
    lines = []
    adapt([state], step=STEP, limit=2, train=_train_on_the_law, report=lines.append)
    assert state.outcome == "limit" and state.added == 2 and len(state.targets) == 7
    assert lines[-1] == "adapt: not bracketed, at the limit of added sizes: C=1e+21 (2 added)"
    again = []  # a later launch: the sizes it added count toward the limit, so nothing more is added
    resumed = BudgetState(state.budget, state.targets, state.points, added=2)
    adapt([resumed], step=STEP, limit=2, train=_train_on_the_law, report=again.append)
    assert resumed.outcome == "limit" and again == [lines[-1]]


def test_a_size_the_rule_cannot_add_closes_that_budget():
    """``train`` says None (the size rule maps the target to a shape the budget has): no new size, no loop."""
    state = _state(1e21, [2.0**k for k in range(-6, -1)])
    calls = []

    def capped(proposals):
        calls.append(len(proposals))
        return {p: None if p.target > float(LAW.n_opt(1e21)) * 0.6 else _train_on_the_law([p])[p] for p in proposals}

    lines = []
    adapt([state], step=STEP, limit=5, train=capped, report=lines.append)
    assert state.outcome == "no new size" and state.added == 1 and calls == [1, 1]
    assert lines[-1] == "adapt: not bracketed, no new size beyond the edge: C=1e+21 (1 added)"


def test_next_size_continues_the_log_spacing_beyond_the_edge():
    n_opt = float(LAW.n_opt(1e21))
    centred = _state(1e21, [0.25, 0.5, 1.0, 2.0, 4.0])
    assert next_size(1e21, centred.points, centred.targets, STEP) is None
    high = _state(1e21, [4.0, 8.0, 16.0])
    proposal = next_size(1e21, high.points, high.targets, STEP)
    assert (proposal.edge, proposal.at) == ("lower", pytest.approx(4 * n_opt))
    assert proposal.target == pytest.approx(2 * n_opt) and proposal.budget == 1e21
    with pytest.raises(ValueError, match="2 distinct finished sizes, need 3"):
        next_size(1e21, high.points[:2] * 2, high.targets, STEP)


def test_minimum_edge_is_the_fits_bracketing():
    N = np.array([1.0, 2.0, 4.0, 8.0])
    assert minimum_edge(N, np.array([3.0, 2.0, 2.1, 3.0]), 2.5) is None
    assert minimum_edge(N, np.array([1.0, 2.0, 2.1, 3.0]), 0.5) == "lower"
    assert minimum_edge(N, np.array([3.0, 2.0, 1.9, 1.0]), 9.0) == "upper"
    assert minimum_edge(N, np.array([3.0, 2.0, 2.1, 3.0]), 9.0) == "upper"  # the vertex beyond, the lowest inside
    assert minimum_edge(N, np.array([3.0, 2.0, 2.1, 3.0]), 0.5) == "lower"  # the vertex below, the lowest inside
    assert minimum_edge(N, np.array([3.0, 2.5, 2.0, 1.0]), 0.5) == "upper"  # the lowest loss's edge over the vertex's
    assert minimum_edge(N, np.array([2.5, 2.0, 2.1, 3.0]), 9.0) == "upper"  # the vertex's side over the ends' losses
    assert minimum_edge(N, np.array([2.5, 2.0, 2.1, 3.0]), np.nan) == "lower"  # opens downward: the lower end


def _variant(tmp_path: Path, name: str, isoflop: dict) -> Path:
    spec = yaml.safe_load((ROOT / "sweeps" / "tiny.yaml").read_text())
    spec.update(name=name, isoflop=isoflop)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


CENTER = {"n_opt": 16e3, "budget": 1e9, "span": 4.0, "sizes": 3}


@pytest.mark.parametrize(("isoflop", "message"), [
    ({"params": [8e3, 16e3, 32e3], "adapt": True},
     "isoflop.adapt needs isoflop.center (sizes centred per budget, evenly spaced in log N)"),
    ({"center": CENTER, "adapt": True, "adapt_limit": -1}, "isoflop.adapt_limit must be positive, got -1"),
    ({"center": {**CENTER, "sizes": 2}, "adapt": True},
     "isoflop.adapt needs isoflop.center.sizes of 3 or more (a parabola), got 2"),
    ({"center": {**CENTER, "span": 1.0}, "adapt": True}, "isoflop.adapt needs isoflop.center.span above 1, got 1.0"),
    ({"center": CENTER, "adapt": "yes"}, "isoflop.adapt must be true or false, got 'yes'"),
])
def test_adapt_spec_errors_are_one_line_naming_the_field(tmp_path, isoflop, message):
    path = _variant(tmp_path, "bad", {"budgets": [1e9], **isoflop})
    with pytest.raises(ValueError) as error:
        load_spec(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def _finished(out: Path, runs, losses: list[float]) -> None:
    """Each of ``runs`` "trained" (a final.json) to its loss of ``losses``, without training."""
    for run, loss in zip(runs, losses):
        final = {"params": run.N, "params_non_embedding": run.N_non_embedding, "tokens": run.D,
                 "flops_exact": run.C_exact, "flops_6nd": run.C_6nd, "val_loss": loss}
        (out / "runs" / run.name).mkdir(parents=True)
        (out / "runs" / run.name / "final.json").write_text(json.dumps(final))


def test_an_adaptive_sweep_adds_trains_and_records_its_sizes_and_a_relaunch_resumes_them(tmp_path):
    """C=1e9's three centred runs get final losses falling with N (the minimum at the upper edge) without
    training; adapt plans the next size up (N≈64K, a factor 2 on), appends it to plan.json and trains it for real.
    C=4e9's sizes (16K–64K) are bracketed and hold that model already: another budget's run is no reason to add
    none at this one."""
    path = _variant(tmp_path, "adaptive", {"budgets": [1e9, 4e9], "center": CENTER, "flops": "6ND", "adapt": True,
                                           "adapt_limit": 1})
    spec = load_spec(path)
    runs = plan_runs(spec)
    low, high = ([run for run in runs if run.budget == budget] for budget in (1e9, 4e9))
    assert [run.target_params for run in low] == pytest.approx([8e3, 16e3, 32e3])
    assert [run.target_params for run in high] == pytest.approx([16e3, 32e3, 64e3])
    table = plan_table(runs, workers=1, probe=False, adapt_limit=1)
    assert ("adapt: on, up to 1 more sizes per budget beyond the edge where its minimum lies "
            "(at most 2 more runs, about 5e+09 FLOPs), trained after these") in table
    out = tmp_path / "out"
    _finished(out, low, [3.0, 2.9, 2.8])
    _finished(out, high, [2.9, 2.7, 2.8])
    lines = []
    result = launch(spec, runs, out, LaunchOptions(workers=1), report=lines.append)
    largest = max(run.N for run in low)
    assert lines[0].startswith("sweep adaptive: 6 runs, 0 to train")
    assert f"adapt: C=1e+09 minimum at the upper edge (N={largest:,}); adding N≈6.4e+04" in lines
    assert lines[-1] == "adapt: minimum bracketed: C=1e+09 (1 added), C=4e+09"
    plan = json.loads((out / "plan.json").read_text())["runs"]
    assert [entry["name"] for entry in plan[:6]] == [run.name for run in runs] and len(plan) == 7
    added = plan[6]
    assert added["N"] == high[-1].N and added["target_params"] == pytest.approx(64e3) and added["budget"] == 1e9
    assert added["name"] == f"C1e09-N{added['N']}-s0" and (out / "configs" / f"{added['name']}.yaml").is_file()
    final = json.loads((out / "runs" / added["name"] / "final.json").read_text())  # trained here, for real
    assert final["params"] == added["N"] and final["tokens"] == added["D"] and 0 < final["val_loss"] < 5.6
    assert result.failed == [] and [row["run"] for row in result.rows] == [entry["name"] for entry in plan]
    csv_rows = (out / "results.csv").read_text().splitlines()
    assert len(csv_rows) == 8 and csv_rows[7].startswith(f"{added['name']},done,{added['N']},")

    finals = {p: p.stat().st_mtime for p in (out / "runs").glob("*/final.json")}
    again = []  # a relaunch: the plan with its added run is this sweep's; nothing trains, nothing is added
    launch(spec, runs, out, LaunchOptions(workers=1), report=again.append)
    assert again[0].startswith("sweep adaptive: 7 runs, 0 to train") and not any("adding" in l for l in again)
    assert finals == {p: p.stat().st_mtime for p in (out / "runs").glob("*/final.json")}
    assert json.loads((out / "plan.json").read_text())["runs"] == plan

    (out / "runs" / added["name"] / "final.json").unlink()  # the added run left partial: a relaunch resumes it
    resumed = []
    launch(spec, runs, out, LaunchOptions(workers=1), report=resumed.append)
    assert resumed[0].startswith("sweep adaptive: 7 runs, 1 to train") and not any("adding" in l for l in resumed)
    assert json.loads((out / "runs" / added["name"] / "final.json").read_text())["resumed_from"]["step"] == added["steps"]
    assert json.loads((out / "plan.json").read_text())["runs"] == plan

    fixed = load_spec(_variant(tmp_path, "adaptive", {"budgets": [1e9, 4e9], "center": CENTER, "flops": "6ND"}))
    with pytest.raises(ValueError, match="holds a different sweep"):  # without adapt, the added run is not its own
        launch(fixed, plan_runs(fixed), out, LaunchOptions(workers=1), report=[].append)


def test_a_sweep_without_adapt_adds_no_size_beyond_an_edge(tmp_path):
    spec = load_spec(_variant(tmp_path, "fixed", {"budgets": [1e9], "center": CENTER, "flops": "6ND"}))
    runs, out, lines = plan_runs(spec), tmp_path / "out", []
    _finished(out, runs, [3.0, 2.9, 2.8])  # the minimum at the upper edge
    result = launch(spec, runs, out, LaunchOptions(workers=1), report=lines.append)
    assert lines == [f"sweep fixed: 3 runs, 0 to train, local executor → {out}",
                     "layout: 1 processes × 1 threads (from the command line)", f"sweep {out}: done 3 in 0m00s"]
    assert result.failed == [] and len(result.rows) == 3
    assert len(json.loads((out / "plan.json").read_text())["runs"]) == 3 and len(list((out / "runs").iterdir())) == 3


def test_a_next_size_the_rule_maps_onto_the_edges_model_ends_the_budget_untrained(tmp_path):
    """Sizes a factor 1.22 apart (span 1.5): N≈24K beyond the upper edge gets the edge's own shape (N 21,600), so
    the budget stays unbracketed, nothing is added to the plan and nothing trains."""
    spec = load_spec(_variant(tmp_path, "close", {"budgets": [1e9], "center": {**CENTER, "span": 1.5},
                                                  "flops": "6ND", "adapt": True, "adapt_limit": 2}))
    runs, out, lines = plan_runs(spec), tmp_path / "out", []
    assert [run.N for run in runs] == [12368, 16496, 21600]
    _finished(out, runs, [3.0, 2.9, 2.8])
    result = launch(spec, runs, out, LaunchOptions(workers=1), report=lines.append)
    assert lines[-2:] == ["adapt: C=1e+09: the size rule gives N≈2.4e+04 a shape it has (N=21,600); no new size "
                          "beyond the upper edge",
                          "adapt: not bracketed, no new size beyond the edge: C=1e+09"]
    assert len(json.loads((out / "plan.json").read_text())["runs"]) == 3 and len(result.rows) == 3
    assert len(list((out / "runs").iterdir())) == 3 and not (out / "logs").exists()
