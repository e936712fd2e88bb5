"""The tuning stage (a sweep's ``tune:``): a known optimum recovered, a real tiny stage end to end, bad input."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from matplotlib.image import imread

from jaxformer.cli import main
from jaxformer.scaling.plots import plot_tuning, save
from jaxformer.scaling.tuning import edge_notes, fit_tuning, lr_optimum
from jaxformer.sweep.directory import prepare_directory
from jaxformer.sweep.formula import evaluate
from jaxformer.sweep.plan import plan_runs
from jaxformer.sweep.spec import load_spec
from jaxformer.sweep.tune import (_tuning_spec, best_settings, extrapolation_note, matching_record, plan_tuning,
                                  with_rule, write_record)

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "sweeps" / "tiny.yaml"


def true_lr(N):
    """The synthetic objective's optimum: lr*(N) = 3e-3 · (N / 3e4)^-0.3."""
    return 3e-3 * (np.asarray(N, dtype=float) / 3e4) ** -0.3


def synthetic_loss(N, lr, E=2.0, a=0.08):
    """loss(N, lr) = E + a · (ln lr − ln lr*(N))²: a parabola in ln lr, lowest at lr*(N)."""
    return E + a * (np.log(lr) - np.log(true_lr(N))) ** 2


def grid_table(sizes, grid):
    N, lr = (x.ravel() for x in np.meshgrid(sizes, grid, indexing="ij"))
    return N, lr, synthetic_loss(N, lr)


def test_the_fit_recovers_a_known_optimum_and_its_power_law(tmp_path):
    """The loss is exactly quadratic in ln lr, so the three-point parabola's vertex is lr*(N) itself and ln lr*
    is exactly linear in ln N: c and k come back to rounding (1e-9), while the grid points alone are off by up
    to half a grid step (a factor 10^(1/8) ≈ 1.33). The formula prints 6 significant figures: within 1e-4."""
    sizes = np.array([1e4, 3e4, 1e5, 3e5])
    grid = np.geomspace(3e-4, 3e-2, 9)  # a factor 10^(1/4) apart; every lr*(N) (1.5e-3 … 4.2e-3) inside
    fit = fit_tuning(*grid_table(sizes, grid))
    assert [o.N for o in fit.optima] == list(sizes)
    for o in fit.optima:
        assert o.refined and o.edge is None
        assert o.lr == pytest.approx(float(true_lr(o.N)), rel=1e-9) and o.loss == pytest.approx(2.0, abs=1e-12)
        assert o.grid_lr in grid and abs(np.log(o.grid_lr / o.lr)) <= np.log(10) / 8 + 1e-12
    assert max(abs(np.log(o.grid_lr / o.lr)) for o in fit.optima) > 0.05  # the refinement mattered
    assert fit.rule.k == pytest.approx(-0.3, abs=1e-9)
    assert fit.rule.N0 == 5.5e4  # the sizes' geometric mean 5.48e4, to two figures
    assert fit.rule.c == pytest.approx(float(true_lr(5.5e4)), rel=1e-9)
    assert fit.rule.formula == f"{fit.rule.c:.6g} * (N / 55000) ** -0.3"
    for N in (1e3, 3e4, 1e7):  # the formula the sweep trains with, in the sweep's own grammar; the figure's line
        assert evaluate(fit.rule.formula, {"N": N}) == pytest.approx(float(true_lr(N)), rel=1e-4)
        assert fit.rule.lr(N) == pytest.approx(float(true_lr(N)), rel=1e-9)
    assert edge_notes(fit) == []
    figure = save(plot_tuning(fit), tmp_path, "tune")[0]
    image = imread(figure)
    assert image.shape[0] > 300 and image.std() > 0.05  # opened, and not blank


def test_an_optimum_at_the_grid_edge_is_flagged_and_kept_at_the_grid_point():
    grid = np.geomspace(1e-3, 3e-3, 3)
    # N = 1e4: lr* = 4.2e-3, above the grid; N = 3e6: lr* = 7.5e-4, below it
    fit = fit_tuning(*grid_table(np.array([1e4, 3e6]), grid))
    high, low = fit.optima
    assert (high.edge, high.refined, high.lr) == ("high", False, pytest.approx(3e-3))
    assert (low.edge, low.refined, low.lr) == ("low", False, pytest.approx(1e-3))
    assert high.loss == pytest.approx(float(synthetic_loss(1e4, 3e-3)))
    notes = edge_notes(fit)
    assert len(notes) == 2 and "N=10,000: the best learning rate 0.003 is the grid's largest" in notes[0]
    assert "N=3,000,000: the best learning rate 0.001 is the grid's smallest" in notes[1]


def test_a_diverged_neighbour_leaves_the_grid_point_and_an_all_diverged_size_is_refused():
    grid = np.array([1e-3, 3e-3, 1e-2, 3e-2])
    loss = synthetic_loss(3e4, grid)
    loss[2] = np.nan  # the run above the best one diverged
    optimum = lr_optimum(3e4, grid, loss)
    assert (optimum.lr, optimum.edge, optimum.refined) == (3e-3, None, False)
    with pytest.raises(ValueError, match="every tuning run of N=30,000 diverged"):
        lr_optimum(3e4, grid, np.full(4, np.nan))


def jaxformer(capsys, *args) -> tuple[int, str, str]:
    """The command line in this process (JAX already imported; the runs still train in worker processes)."""
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def tuned_spec(tmp_path: Path, name: str = "tuned", **changes) -> Path:
    """sweeps/tiny.yaml with one budget of two sizes, its lr formula replaced by a tuning stage (4 rates × 2 sizes,
    of 40 and 20 steps) and checkpoints at the end only."""
    spec = yaml.safe_load(TINY.read_text())
    del spec["hyperparameters"]
    spec["base"]["checkpoint"]["interval"] = 1000
    spec.update(name=name, isoflop={"budgets": [1e9], "params": [8e3, 16e3], "flops": "6ND"},
                tune={"budget": 5e8, "params": [8e3, 16e3], "lr": [3e-3, 1e-2, 3e-2, 1e-1]})
    spec.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_tuning_stage_end_to_end_then_the_sweep_trains_with_its_rule(tmp_path, capsys):
    spec, out = tuned_spec(tmp_path), tmp_path / "out"
    code, planned, _ = jaxformer(capsys, "sweep", spec, "--dry-run", "--no-probe", "--out", out)
    assert code == 0
    assert "tune-lr0.003-C5e08-N8240-s0" in planned and "tune-lr0.1-C5e08-N16496-s0" in planned
    assert "take optimizer.lr from the tuning stage's rule" in planned and "C1e09-N8240-s0" in planned
    assert "extrapolated" not in planned  # the sweep's sizes are the tuned ones
    assert not out.exists()

    code, stdout, stderr = jaxformer(capsys, "sweep", spec, "--out", out, "--workers", 1)
    assert code == 0 and "extrapolated" not in stdout, stdout + stderr
    record = json.loads((out / "tune" / "tune.json").read_text())
    assert [r["run"] for r in record["runs"]] == [f"tune-lr{lr}-C5e08-N{n}-s0" for n in (8240, 16496)
                                                  for lr in ("0.003", "0.01", "0.03", "0.1")]
    finals = {r["run"]: json.loads((out / "tune" / "runs" / r["run"] / "final.json").read_text())
              for r in record["runs"]}
    for r in record["runs"]:  # each trained at its own rate, and its loss is the run's final validation loss
        assert r["status"] == "done" and r["loss"] == finals[r["run"]]["val_loss"] < 5.6
        config = yaml.safe_load((out / "tune" / "configs" / f"{r['run']}.yaml").read_text())
        assert config["optimizer"]["lr"] == r["lr"] and finals[r["run"]]["params"] == r["N"]
    refit = fit_tuning(*(np.array([r[k] for r in record["runs"]], dtype=float) for k in ("N", "lr", "loss")))
    assert record["rule"]["c"] == pytest.approx(refit.rule.c, rel=1e-12)
    assert record["rule"]["k"] == pytest.approx(refit.rule.k, rel=1e-12)
    formula = record["rule"]["formula"]
    assert formula == refit.rule.formula and f"optimizer.lr = {formula}" in stdout
    assert [o["edge"] for o in record["optima"]] == [o.edge for o in refit.optima]
    image = imread(out / "tune" / "tune.png")
    assert image.shape[0] > 300 and image.std() > 0.05  # opened, and not blank

    plan = json.loads((out / "plan.json").read_text())
    assert plan["lr_rule"] == {"formula": formula, "source": "tune/tune.json"}
    assert yaml.safe_load((out / "spec.yaml").read_text())["hyperparameters"]["optimizer.lr"] == formula
    for run in plan["runs"]:  # the sweep's runs train with the rule at their own N
        config = yaml.safe_load((out / "configs" / f"{run['name']}.yaml").read_text())
        assert config["optimizer"]["lr"] == pytest.approx(evaluate(formula, {"N": run["N"]}), rel=1e-12)
        assert (out / "runs" / run["name"] / "final.json").is_file()
    assert "tune-" not in (out / "results.csv").read_text()  # the tuning runs are no part of the sweep's table
    records = [json.loads(p.read_text()) for p in [*(out / "tune" / "status").glob("*.json"),
                                                    *(out / "status").glob("*.json")]]
    assert len(records) == 8 + len(plan["runs"])  # one warm worker trained the tuning stage and the sweep
    assert len({record["worker"] for record in records}) == 1

    before = {p: p.stat().st_mtime_ns for p in (out / "tune" / "runs").glob("*/final.json")}
    code, again, _ = jaxformer(capsys, "sweep", spec, "--out", out)
    assert code == 0 and "matches the spec, nothing to train" in again and "0 to train" in again, again
    assert before == {p: p.stat().st_mtime_ns for p in (out / "tune" / "runs").glob("*/final.json")}
    assert json.loads((out / "tune" / "tune.json").read_text()) == record
    code, stage, _ = jaxformer(capsys, "tune", spec, "--out", out)
    assert code == 0 and "nothing to train" in stage, stage
    code, dry, _ = jaxformer(capsys, "sweep", spec, "--dry-run", "--no-probe", "--out", out)
    assert f"optimizer.lr = {formula} (the tuning stage's rule" in dry and "tune-lr" not in dry

    # a tune.json edited out of shape (it was a traceback, or a formula of 5 became every run's lr), or whose
    # formula is text outside the spec grammar: refitted
    for damage in ({"rule": None}, {"rule": {**record["rule"], "formula": 5}}, {"runs": ["x"]}, {"failed": None},
                   {"rule": {**record["rule"], "formula": "3e-3 * (N /"}}):
        (out / "tune" / "tune.json").write_text(json.dumps({**record, **damage}))
        code, dry, _ = jaxformer(capsys, "sweep", spec, "--dry-run", "--no-probe", "--out", out)
        assert code == 0 and "tuning stage, trained first" in dry, dry
        code, stage, _ = jaxformer(capsys, "tune", spec, "--out", out, "--retry-failed")
        assert code == 0 and "8 runs, 0 to train" in stage and f"optimizer.lr = {formula}" in stage, stage
        assert json.loads((out / "tune" / "tune.json").read_text()) == record

    # a base the tuning runs were not trained with: their rule is not reused, and the relaunch is refused
    base = {**yaml.safe_load(spec.read_text())["base"], "optimizer": {"weight_decay": 0.05}}
    code, _, refused = jaxformer(capsys, "sweep", tuned_spec(tmp_path, base=base), "--out", out)
    assert code == 2 and "tune-lr0.003-C5e08-N8240-s0: optimizer.weight_decay was 0.1, now 0.05" in refused
    assert json.loads((out / "tune" / "tune.json").read_text()) == record


def test_a_sweep_beyond_the_tuned_sizes_is_told_its_rule_is_extrapolated(tmp_path, capsys):
    """The rule is a power law fitted on N = 8240 and 16496; a sweep size of 67824 (4.11x the largest) takes it
    extrapolated, and the plan says so (as sweeps/cpu-chinchilla-tuned.yaml's runs, 5.4x beyond, were not told)."""
    spec = tuned_spec(tmp_path, isoflop={"budgets": [4e9], "params": [8e3, 16e3, 64e3], "flops": "6ND"})
    code, planned, _ = jaxformer(capsys, "sweep", spec, "--dry-run", "--no-probe", "--out", tmp_path / "out")
    assert code == 0 and "C4e09-N67824-s0" in planned
    assert ("note: the tuned lr rule is extrapolated up to 4.11x beyond the sizes it is fitted on: the sweep's runs "
            "have N = 8,240 to 67,824, the tuning runs 8,240 to 16,496 (tune.params)") in planned


def test_any_size_beyond_the_tuned_ones_above_or_below_is_noted():
    tuning = [SimpleNamespace(N=n) for n in (1000, 4000)]  # `extrapolation_note` reads the runs' N alone
    assert extrapolation_note(tuning, [SimpleNamespace(N=n) for n in (1000, 2000, 4000)]) is None
    above = extrapolation_note(tuning, [SimpleNamespace(N=n) for n in (1000, 6000)])
    below = extrapolation_note(tuning, [SimpleNamespace(N=n) for n in (800, 4000)])
    assert "up to 1.5x beyond the sizes it is fitted on: the sweep's runs have N = 1,000 to 6,000" in above
    assert "up to 1.25x beyond the sizes it is fitted on: the sweep's runs have N = 800 to 4,000" in below


def test_another_sweeps_directory_is_refused_before_a_tuning_run_trains_in_it(tmp_path, capsys):
    """`jaxformer sweep` trained the whole tuning stage into a directory whose plan.json is another sweep's, and
    only then refused it (`jaxformer tune` refused at once); both now refuse first, writing nothing."""
    out = tmp_path / "out"
    other = load_spec(tuned_spec(tmp_path, name="other", isoflop={"budgets": [1e9], "params": [8e3, 32e3],
                                                                  "flops": "6ND"}))
    prepare_directory(other, plan_runs(other), out)  # as its launch left it before any run trained
    before = sorted(path.relative_to(out) for path in out.rglob("*"))
    for command in ("sweep", "tune"):
        code, _, stderr = jaxformer(capsys, command, tuned_spec(tmp_path), "--out", out, "--workers", 1)
        assert code == 2 and stderr == (f"jaxformer {command}: error: --out {out} holds a different sweep (its "
                                         "plan.json lists other runs); use a new --out\n"), stderr
        assert sorted(path.relative_to(out) for path in out.rglob("*")) == before


def test_a_changed_tuning_grid_names_the_sweeps_out_not_its_tuning_directory(tmp_path, capsys):
    """A relaunch with another tune.lr was refused as "--out OUT/tune holds a different sweep ...; use a new --out":
    OUT/tune is not the --out the user gave (given as one, it would start a sweep inside the stage's directory). The
    line now names the sweep's --out and what changed, for the launch, `jaxformer tune` and the dry run (which prints
    the plan first), writing nothing."""
    out = tmp_path / "out"
    begun = load_spec(tuned_spec(tmp_path))
    prepare_directory(_tuning_spec(begun), plan_tuning(begun), out / "tune")  # as its launch left it
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    changed = tuned_spec(tmp_path, tune={"budget": 5e8, "params": [8e3, 16e3], "lr": [1e-3, 3e-3, 1e-2, 3e-2]})
    refusal = (f"--out {out} holds another tuning stage ({out / 'tune'}/plan.json lists other tuning runs than this "
               "spec's tune: plans); use a new --out, or restore the tune: its runs were planned with")
    for command in ("sweep", "tune"):
        code, _, stderr = jaxformer(capsys, command, changed, "--out", out, "--workers", 1)
        assert (code, stderr) == (2, f"jaxformer {command}: error: {refusal}\n")
    code, planned, stderr = jaxformer(capsys, "sweep", changed, "--dry-run", "--no-probe", "--out", out)
    assert (code, stderr) == (2, f"jaxformer sweep: error: the launch would refuse: {refusal}\n")
    assert "tune-lr0.001-C5e08-N8240-s0" in planned and "C1e09-N16496-s0" in planned
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before


def test_a_tuning_run_that_failed_without_diverging_leaves_no_rule_until_it_trains(tmp_path, capsys):
    """A run that crashed (here: a file in its run directory's place) says nothing of its rate. Counted as worse
    than any other, as a diverged run is, it moved N=8240's optimum from 0.03 to the grid's edge 0.1 and the rule
    to 0.1 · (N / 12000)^0, which the sweep then trained with. Now no rule is fitted and the command exits 1
    until --retry-failed trains it."""
    spec, out = tuned_spec(tmp_path), tmp_path / "out"
    crashed = out / "tune" / "runs" / "tune-lr0.03-C5e08-N8240-s0"
    crashed.parent.mkdir(parents=True)
    crashed.write_text("not a run directory\n")
    code, stdout, _ = jaxformer(capsys, "sweep", spec, "--out", out, "--workers", 1)
    assert code == 1 and "1 of 8 tuning runs failed without diverging" in stdout, stdout
    assert stdout.rstrip().endswith("relaunch with --retry-failed: tune-lr0.03-C5e08-N8240-s0")
    assert not (out / "tune" / "tune.json").exists() and not (out / "plan.json").exists()
    code, stdout, _ = jaxformer(capsys, "tune", spec, "--out", out)  # not retried: still no rule, nothing trained
    assert code == 1 and "8 runs, 0 to train" in stdout and not (out / "tune" / "tune.json").exists()

    crashed.unlink()
    code, stdout, _ = jaxformer(capsys, "tune", spec, "--out", out, "--retry-failed")
    assert code == 0 and "8 runs, 1 to train" in stdout, stdout
    record = json.loads((out / "tune" / "tune.json").read_text())
    assert record["failed"] == [] and [r["status"] for r in record["runs"]] == ["done"] * 8
    assert record["optima"][0]["grid_lr"] == 0.03 and record["optima"][0]["edge"] is None
    refit = fit_tuning(*(np.array([r[k] for r in record["runs"]], dtype=float) for k in ("N", "lr", "loss")))
    assert record["rule"]["formula"] == refit.rule.formula and refit.rule.k > 0.5


GOOD = {"budget": 5e8, "params": [8e3, 16e3], "lr": [1e-3, 3e-3, 1e-2]}  # a valid tune: section


def test_a_diverged_tuning_run_is_retried_only_until_the_sweeps_runs_are_planned_with_the_rule(tmp_path, capsys):
    """--retry-failed trains diverged tuning runs again, and a refit rule would change under the sweep's runs already
    trained with the old one (and every later launch would be refused): once the sweep is planned, the rule is kept."""
    spec, out = tuned_spec(tmp_path, tune={**GOOD, "lr": [1e-2, 3e-2, 1e3]}), tmp_path / "out"
    code, stdout, _ = jaxformer(capsys, "tune", spec, "--out", out, "--workers", 1)
    assert code == 0 and "2 of 6 runs diverged" in stdout, stdout
    record = json.loads((out / "tune" / "tune.json").read_text())
    assert record["failed"] == ["tune-lr1e+03-C5e08-N8240-s0", "tune-lr1e+03-C5e08-N16496-s0"]
    code, stdout, _ = jaxformer(capsys, "tune", spec, "--out", out, "--retry-failed")  # not planned yet: retried
    assert code == 0 and "6 runs, 2 to train" in stdout, stdout
    code, stdout, _ = jaxformer(capsys, "sweep", spec, "--out", out, "--workers", 1)
    assert code == 0 and (out / "plan.json").is_file()
    trained = {p: p.stat().st_mtime_ns for p in (out / "tune" / "status").glob("*.json")}
    for command in ("sweep", "tune"):
        code, stdout, _ = jaxformer(capsys, command, spec, "--out", out, "--retry-failed")
        assert code == 0 and "matches the spec, nothing to train" in stdout, stdout
    assert trained == {p: p.stat().st_mtime_ns for p in (out / "tune" / "status").glob("*.json")}
    assert json.loads((out / "tune" / "tune.json").read_text()) == record


def test_the_pair_chosen_has_the_lowest_mean_over_sizes_of_each_sizes_best_loss():
    """Three sizes: (0.9, 8) is best at the smallest size only (0.5, then 1.2 and 1.2: mean 0.97) and (0.99, 16)
    level at 0.9 (mean 0.9), so (0.99, 16) is chosen; a diverged run (no loss) is worse than any."""
    losses = {(0.9, 8): (0.5, 1.2, 1.2), (0.99, 16): (0.9, 0.9, 0.9)}
    records = [{"N": N, "beta2": beta2, "batch_size": batch, "loss": loss + extra}
               for (beta2, batch), row in losses.items() for N, loss in zip((1e4, 2e4, 4e4), row)
               for extra in (0.0, 0.3)]
    records.append({"N": 2e4, "beta2": 0.9, "batch_size": 8, "loss": None})
    assert best_settings(records) == (0.99, 16)


def test_a_beta2_and_batch_grid_chooses_one_pair_applies_it_and_fits_the_rule_on_its_runs(tmp_path):
    """With a beta2 × batch-size grid, the rule was fitted on each size's best pair while the sweep trained at the
    base config's (0.95, 16): its rates belonged to other settings. Now one pair is chosen for all sizes (the lowest
    mean over sizes of each size's best loss), set in the sweep's runs, and the rule is fitted on its runs alone.
    The tuning runs' losses are the synthetic law's (no training): N = 8240 does best at (0.99, 8), N = 16496 at
    (0.9, 8) by less, so (0.99, 8) wins on the mean; its runs' lr optimum is 2e-2 · (N / 8240)^-0.5."""
    spec = load_spec(tuned_spec(tmp_path, tune={**GOOD, "lr": [3e-3, 1e-2, 3e-2, 1e-1], "beta2": [0.9, 0.99],
                                                "batch_size": [8, 16]}))
    runs = plan_tuning(spec)
    offsets = {(0.99, 8): (0.0, 0.02), (0.9, 8): (0.05, -0.01), (0.9, 16): (0.2, 0.2), (0.99, 16): (0.3, 0.3)}

    def loss(run) -> float:
        beta2, batch, N = run.config["optimizer"]["beta2"], run.config["train"]["batch_size"], run.N
        optimum = 2e-2 * (N / 8240) ** -0.5 * (1.5 if (beta2, batch) != (0.99, 8) else 1.0)
        return 3.0 + offsets[beta2, batch][N > 10_000] + 0.1 * np.log(run.config["optimizer"]["lr"] / optimum) ** 2

    rows = [{"run": run.name, "status": "done", "loss": loss(run), "reason": ""} for run in runs]
    directory = tmp_path / "out" / "tune"
    directory.mkdir(parents=True)
    record, lines = write_record(spec, runs, rows, directory)
    assert record["applied"] == {"optimizer.beta2": 0.99, "train.batch_size": 8}
    assert [(b["N"], b["beta2"], b["batch_size"]) for b in record["best_by_size"]] == [(8240, 0.99, 8),
                                                                                     (16496, 0.9, 8)]
    assert record["rule"]["k"] == pytest.approx(-0.5, abs=1e-9)
    assert evaluate(record["rule"]["formula"], {"N": 8240}) == pytest.approx(2e-2, rel=1e-5)
    assert any(line.startswith("tuning: the sweep's runs train with optimizer.beta2 = 0.99, train.batch_size = 8 (")
               for line in lines)
    # each size's own best: 3 + 0.1·ln(0.03 / 0.02)² and 2.99 + 0.1·ln(0.03 / 0.0212)²
    assert [line for line in lines if "its own best" in line] == [
        "tuning: N = 8,240: its own best is beta2 0.99, batch size 8 (lr 0.03, loss 3.0164)",
        "tuning: N = 16,496: its own best is beta2 0.9, batch size 8 (lr 0.03, loss 3.0020)"]
    for run in plan_runs(with_rule(spec, record)):  # the sweep's runs at the chosen pair and the rule's rate
        assert (run.config["optimizer"]["beta2"], run.config["train"]["batch_size"]) == (0.99, 8)
        assert run.config["optimizer"]["lr"] == pytest.approx(evaluate(record["rule"]["formula"], {"N": run.N}))
    # a record whose applied pair is edited to one outside the grid, or to another setting, matches nothing
    assert matching_record(spec, runs, directory) == record
    for applied in ({"optimizer.beta2": 0.5, "train.batch_size": 8}, {"optimizer.beta2": 0.99},
                    {"optimizer.beta2": 0.99, "train.batch_size": 8, "optimizer.lr": 1.0}, None):
        (directory / "tune.json").write_text(json.dumps({**record, "applied": applied}))
        assert matching_record(spec, runs, directory) is None


@pytest.mark.parametrize(("tune", "message"), [
    ({**GOOD, "budget": -1}, "tune.budget must be a positive number of FLOPs, got -1"),
    ({**GOOD, "budget": 0}, "tune.budget must be a positive number of FLOPs, got 0"),
    ({**GOOD, "params": [-8e3, 16e3]}, "tune.params must list two or more distinct positive sizes, got [-8000.0, "),
    ({**GOOD, "params": [0, 16e3]}, "tune.params must list two or more distinct positive sizes, got [0.0, 16000.0]"),
    ({**GOOD, "lr": [0, 1e-3, 3e-3]}, "tune.lr must list three or more distinct positive learning rates, got [0.0, "),
    ({**GOOD, "params": [8e3]}, "tune.params must list two or more distinct positive sizes, got [8000.0]"),
    ({**GOOD, "lr": [1e-3, 3e-3]}, "tune.lr must list three or more distinct positive learning rates, got [0.001, 0.003]"),
    ({**GOOD, "lr": [1e-3, 3e-3, -1]}, "tune.lr must list three or more distinct positive"),
    ({**GOOD, "beta2": [0.95, 1.0]}, "tune.beta2 must list distinct numbers in [0, 1), got [0.95, 1.0]"),
    ({**GOOD, "batch_size": [0]}, "tune.batch_size must list distinct positive integers, got [0]"),
    ({**GOOD, "batches": [8]}, "unknown config key 'tune.batches'"),
])
def test_bad_tune_sections_name_the_field_and_value(tmp_path, tune, message):
    with pytest.raises(ValueError) as error:
        load_spec(tuned_spec(tmp_path, tune=tune))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_tune_section_at_the_edges_of_its_ranges_loads(tmp_path):
    """beta2 0 and a batch of 1 are in range; a beta2 the tuning stage does not tune may be a hyperparameter."""
    spec = load_spec(tuned_spec(tmp_path, "edges", tune={**GOOD, "beta2": [0.0, 0.95], "batch_size": [1, 8]}))
    assert (spec.tune.beta2, spec.tune.batch_size) == ([0.0, 0.95], [1, 8])
    spec = load_spec(tuned_spec(tmp_path, "beta2", hyperparameters={"optimizer.beta2": 0.99}))
    assert spec.hyperparameters == {"optimizer.beta2": 0.99} and spec.tune.beta2 == []


@pytest.mark.parametrize(("command", "changes", "message"), [
    ("tune", {"tune": None}, "has no tune: section to run"),  # tune: null, no section
    ("tune", {"hyperparameters": {"optimizer.lr": "3e-3"}}, "tune and hyperparameters.optimizer.lr both set optim"),
    ("sweep", {"tune": {**GOOD, "beta2": [0.9, 0.99]}, "hyperparameters": {"optimizer.beta2": "0.95"}},
     "tune.beta2 and hyperparameters.optimizer.beta2 both set optimizer.beta2; keep one"),
    # the tuning stage's budget and sizes are named as the stage's, not as the sweep's own budgets and sizes
    ("tune", {"tune": {**GOOD, "budget": 1e6}}, "error: tune: budget C=1e+06 is too small for params=8e+03"),
    ("sweep", {"tune": {**GOOD, "budget": 1e6}}, "error: tune: budget C=1e+06 is too small for params=8e+03"),
    ("tune", {"tune": {**GOOD, "budget": 1e3}},  # under one token: the budget is named, not train.tokens=0
     "tune: budget C=1e+03 is too small for params=8e+03 (N=8,240): 0 tokens is less than one step of 256 tokens"),
    ("sweep", {"tune": {**GOOD, "params": [100, 8e3]}}, "error: tune: shape rule gives too few layers for params=100"),
])
def test_bad_input_exits_2_with_one_line_before_any_run(tmp_path, capsys, command, changes, message):
    code, _, stderr = jaxformer(capsys, command, tuned_spec(tmp_path, **changes), "--out", tmp_path / "out")
    assert code == 2 and message in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_tune_on_a_missing_spec_or_with_a_bad_flag_exits_2_with_one_line(tmp_path, capsys):
    code, _, stderr = jaxformer(capsys, "tune", tmp_path / "missing.yaml")
    assert code == 2 and "config file not found" in stderr and len(stderr.strip().splitlines()) == 1
    code, _, stderr = jaxformer(capsys, "tune", tuned_spec(tmp_path), "--workers", 0)
    assert code == 2 and stderr.strip() == "jaxformer tune: error: --workers must be positive, got 0"
