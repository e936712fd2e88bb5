"""The sweep runner end to end: plan, local and Ray executors, resume after SIGKILL, failure isolation, bad input."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from jaxformer.accounting import count_params
from jaxformer.models.presets import get_preset
from jaxformer.sweep.plan import plan_runs
from jaxformer.sweep.sizing import ShapeRule, shape_for_params
from jaxformer.sweep.spec import load_spec
from sweep_helpers import ROOT, TINY, jaxformer, variant


def test_plan_has_exact_counts_whole_steps_and_isoflop_compute():
    runs = plan_runs(load_spec(TINY))
    assert len(runs) == 4
    for run in runs:
        tokens_per_step = run.config["train"]["batch_size"] * run.config["train"]["seq_len"]
        assert run.D % tokens_per_step == 0 and run.steps == run.D // tokens_per_step
        assert run.C == 6 * run.N * run.D
        assert abs(run.C / run.budget - 1) < 0.03  # whole steps: within a step of the budget
        # the nearest whole number of steps: within half a step's FLOPs of the budget
        assert abs(run.C - run.budget) <= 6 * run.N * tokens_per_step / 2
        assert run.config["train"]["tokens"] == run.D
        # the spec's formula (sweeps/tiny.yaml) at the run's own N, its model's exact count, not the size asked for
        assert run.config["optimizer"]["lr"] == pytest.approx(3e-3 * (run.N / 1e4) ** -0.25, rel=1e-12)
        assert run.N != run.target_params
    assert len({run.N for run in runs}) == 2


def test_the_launcher_plans_the_main_job_without_importing_jax():
    """The process that plans and supervises never trains: reading specs and configs, sizing the models and
    planning every run (the tuning stage, trunks and branches of the README's main job) import no JAX, Flax,
    Optax or Orbax, so its workers start without waiting for them."""
    code = ("import sys; from jaxformer.sweep.launch import launch; from jaxformer.sweep.plan import plan_runs; "
            "from jaxformer.sweep.spec import load_spec; from jaxformer.sweep.tune import plan_tuning; "
            f"spec = load_spec({str(ROOT / 'sweeps' / 'quick.yaml')!r}); runs = plan_runs(spec); plan_tuning(spec); "
            "print(len(runs), sorted({'jax', 'flax', 'optax', 'orbax'} & {m.split('.')[0] for m in sys.modules}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.split(maxsplit=1) == ["70", "[]\n"]


def test_budgets_are_exact_training_flops_by_default(tmp_path):
    """Without ``flops:``, C is the accounting's exact count of the planned model (attention and head included)."""
    from jaxformer.accounting import training_flops
    from jaxformer.train.config import config_from_dict

    spec = variant(tmp_path, "exact", isoflop={"budgets": [1e9, 2e9], "params": [8e3, 16e3]})
    for run in plan_runs(load_spec(spec)):
        config = config_from_dict(run.config)
        counted = training_flops(config.model, run.D, config.train.seq_len)
        assert run.flops_rule == "exact" and run.C == pytest.approx(counted["exact"], rel=1e-12)
        assert run.C_exact == run.C and run.C_6nd == pytest.approx(counted["6ND"], rel=1e-12)
        assert run.C > 1.1 * run.C_6nd  # these small models' attention and head are far from negligible
        assert abs(run.C / run.budget - 1) < 0.03
        assert abs(run.C - run.budget) <= run.C / run.steps / 2  # the nearest whole number of steps


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "tiny"
    result = jaxformer("sweep", TINY, "--out", out, "--workers", 2)
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result


def test_tiny_sweep_trains_every_run_and_reports(tiny_sweep):
    out, result = tiny_sweep
    assert "done 4" in result.stdout
    table = json.loads(jaxformer("results", out, "--format", "json").stdout)
    assert [row["status"] for row in table] == ["done"] * 4
    assert all(0 < row["loss"] < 5.6 for row in table)  # below ln(256): the runs learned something


def test_planned_flops_equal_the_runs_recorded_flops(tiny_sweep):
    out, _ = tiny_sweep
    for planned in json.loads((out / "plan.json").read_text())["runs"]:
        final = json.loads((out / "runs" / planned["name"] / "final.json").read_text())
        assert final["params"] == planned["N"] and final["tokens"] == planned["D"]
        assert final["flops_6nd"] == pytest.approx(planned["C"], rel=1e-12)


def test_results_formats(tiny_sweep, tmp_path):
    out, _ = tiny_sweep
    csv_text = jaxformer("results", out).stdout
    assert csv_text.splitlines()[0].startswith("run,status,N,N_non_embedding,D,C,")
    assert jaxformer("results", out, "--format", "parquet", "--output", tmp_path / "r.parquet").returncode == 0
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "r.parquet").num_rows == 4


def test_relaunching_a_finished_sweep_trains_nothing(tiny_sweep):
    out, _ = tiny_sweep
    before = {p: p.stat().st_mtime for p in (out / "runs").glob("*/final.json")}
    result = jaxformer("sweep", TINY, "--out", out)
    assert result.returncode == 0 and "0 to train" in result.stdout
    assert before == {p: p.stat().st_mtime for p in (out / "runs").glob("*/final.json")}


def test_killed_sweep_relaunch_completes_exactly_the_missing_runs(tmp_path):
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "jaxformer.cli", "sweep", str(TINY), "--out", str(out), "--workers", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while not list((out / "runs").glob("*/final.json")) and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    finished_before = {p.parent.name for p in (out / "runs").glob("*/final.json")}
    assert 1 <= len(finished_before) < 4
    result = jaxformer("sweep", TINY, "--out", out, "--workers", 2)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list((out / "runs").glob("*/final.json"))) == 4
    for name in finished_before:  # trained once: one command line in its log
        assert (out / "logs" / f"{name}.log").read_text().count("$ ") == 1


def test_a_failing_run_is_isolated_and_reported(tmp_path):
    spec = variant(tmp_path, "failing", isoflop={"budgets": [1e9], "params": [8e3, 16e3]},
                   hyperparameters={"optimizer.lr": "1e12 if N > 10000 else 3e-3", "optimizer.grad_clip": 0})
    out = tmp_path / "out"
    result = jaxformer("sweep", spec, "--out", out, "--workers", 2)
    assert result.returncode == 1
    rows = {row["run"]: row for row in json.loads(jaxformer("results", out, "--format", "json").stdout)}
    assert rows["C1e09-N8240-s0"]["status"] == "done"
    failed = rows["C1e09-N16496-s0"]
    assert failed["status"] == "failed" and "NonFinite" in failed["reason"]
    assert "failed C1e09-N16496-s0" in result.stdout
    table = (out / "results.csv").read_text().splitlines()  # a failed run is in the table, not "elsewhere"
    assert [line.split(",")[:2] for line in table[1:]] == [["C1e09-N8240-s0", "done"], ["C1e09-N16496-s0", "failed"]]
    again = jaxformer("sweep", spec, "--out", out)
    assert "0 to train" in again.stdout
    retried = jaxformer("sweep", spec, "--out", out, "--retry-failed")
    assert "1 to train" in retried.stdout

    # a relaunch whose spec changes the settings of a run begun (done or failed) is refused before anything is
    # written; a setting a resume may change (logging) is not a change of the runs
    written = {path: path.read_bytes() for path in [out / "spec.yaml", out / "plan.json", *(out / "configs").iterdir()]}
    changed = variant(tmp_path, "failing", isoflop={"budgets": [1e9], "params": [8e3, 16e3]},
                      hyperparameters={"optimizer.lr": "1e12 if N > 10000 else 4e-3", "optimizer.grad_clip": 0})
    refused = jaxformer("sweep", changed, "--out", out)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert ("holds runs begun under other settings (C1e09-N8240-s0: optimizer.lr was 0.003, now 0.004)"
            in refused.stderr)
    assert written == {path: path.read_bytes() for path in written}
    logged = variant(tmp_path, "failing", isoflop={"budgets": [1e9], "params": [8e3, 16e3]},
                     hyperparameters={"optimizer.lr": "1e12 if N > 10000 else 3e-3", "optimizer.grad_clip": 0},
                     base={**yaml.safe_load(TINY.read_text())["base"], "logging": {"interval": 3}})
    assert "0 to train" in jaxformer("sweep", logged, "--out", out).stdout


def test_ray_executor_on_a_local_instance(tmp_path):
    spec = variant(tmp_path, "ray", isoflop={"budgets": [1e9], "params": [8e3, 16e3]})
    out = tmp_path / "out"
    result = jaxformer("sweep", spec, "--out", out, "--executor", "ray", "--workers", 2)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list((out / "runs").glob("*/final.json"))) == 2


@pytest.mark.parametrize(("changes", "message"), [
    ({"isoflop": {"budgets": [1e9], "params": [8e3]}, "learning_rate": 1}, "unknown config key 'learning_rate'"),
    ({"isoflop": {"budgets": [1e6], "params": [8e3]}}, "budget C=1e+06 is too small for params=8e+03"),
    ({"isoflop": {"budgets": [1e9], "params": [100]}}, "shape rule gives too few layers for params=100"),
    ({"isoflop": {"budgets": [1e9], "params": [8e3]}, "shape": {"min_layers": 5, "max_layers": 4}},
     "shape.min_layers must be at most shape.max_layers (4), got 5"),
    ({"base": {"model": {"preset": "tiny", "dmodel": 3}}}, "unknown config key 'model.dmodel'"),
    ({"hyperparameters": {"optimizer.lr": "N **"}}, "hyperparameters.optimizer.lr: cannot evaluate"),
    ({"base": {"model": {"preset": "tiny"}, "data": {"corpus": "synthetic-markov"}, "train": {"seed": 1}}},
     "base.train.seed: the sweep sets it for every run (each run's seed comes from the spec's `seeds:`"),
    ({"hyperparameters": {"train.tokens": "2e3 * N"}}, "hyperparameters.train.tokens: the sweep sets it"),
    ({"fit": {"approaches": [2, 3]}, "verify": {"seeds": [1, 1]}},
     "verify.seeds must list one or more distinct seeds, got [1, 1]"),
    ({"fit": {"approaches": [2, 3]}, "verify": {"seed": 1}}, "unknown config key 'verify.seed'"),
    ({"fit": {"approaches": [2, 3], "flops": "exact"}},
     "fit.flops must be isoflop.flops ('6ND') or unset, got 'exact': the runs of one IsoFLOP budget share its compute"),
    # a value listed twice was blamed on the size rule or a seed ("the size rule mapped two targets to one model,
    # or a seed is listed twice"); the line now names the list
    ({"isoflop": {"budgets": [1e9, 2e9, 1e9], "params": [8e3, 16e3], "flops": "6ND"}},
     "same shape and budget (C1e09-N8240-s0): isoflop.budgets lists 1e+09 twice"),
    ({"isoflop": {"budgets": [1e9], "params": [8e3, 16e3], "flops": "6ND", "repeat": {"budget": 1e9, "seeds": [0]}}},
     "same shape and budget (C1e09-N8240-s0): isoflop.repeat.seeds (with seeds) lists 0 twice"),
    ({"isoflop": {"budgets": [1e9], "params": [8e3, 8.3e3], "flops": "6ND"}},
     "same shape and budget (C1e09-N8240-s0): the size rule mapped two targets to one model"),
    # a model field set by a hyperparameter trained another model than the one planned (N 8,240 planned, 12,368
    # trained, with the planned model's D and C)
    ({"hyperparameters": {"optimizer.lr": 3e-3, "model.num_layers": 2}},
     "hyperparameters.model.num_layers: changes the model the size rule shaped for params=8e+03 (N 8,240, trained "
     "12,368)"),
    # a negative seed planned, then failed every run at its start ('expected non-negative integer')
    ({"seeds": [-1]}, "seeds must be non-negative (each run's train.seed), got [-1]"),
    ({"hyperparameters": {}, "tune": {"budget": 1e9, "params": [8e3, 16e3], "lr": [1e-3, 3e-3, 1e-2], "seed": -2}},
     "tune.seed must be non-negative (each run's train.seed), got -2"),
    # a section given as a hyperparameter replaced the base's whole section (its other fields silently defaults)
    ({"hyperparameters": {"optimizer": {"lr": 3e-3}}},
     "hyperparameters.optimizer: each key names one field, dotted, with a number or formula"),
    # a section without a field it cannot do without: one line, not a TypeError traceback (exit 1)
    ({"isoflop": {"params": [8e3, 16e3]}}, "missing config key 'isoflop.budgets' (required: budgets)"),
    ({"isoflop": None, "grid": {"params": [8e3]}}, "missing config key 'grid.tokens' (required: params, tokens)"),
    ({"isoflop": {"budgets": [1e9], "center": {"budget": 1e9}}},
     "missing config key 'isoflop.center.n_opt' (required: n_opt, budget)"),
    ({"hyperparameters": {}, "tune": {"params": [8e3, 16e3], "lr": [1e-3, 3e-3, 1e-2]}},
     "missing config key 'tune.budget' (required: budget, params, lr)"),
])
def test_bad_specs_exit_2_with_one_line_before_any_run(tmp_path, changes, message):
    spec = variant(tmp_path, "bad", **changes)
    result = jaxformer("sweep", spec, "--out", tmp_path / "out")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_spec_without_a_name_whose_file_name_is_not_one_says_so(tmp_path):
    """A spec without name: takes its file's; 'my sweep.yaml' was refused as "name must be a plain name ...,
    got 'my sweep'", a name the spec does not hold. The line now says it came from the file name."""
    spec = {k: v for k, v in yaml.safe_load(TINY.read_text()).items() if k != "name"}
    path = tmp_path / "my sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = jaxformer("sweep", path, "--out", tmp_path / "out", "--dry-run", "--no-probe")
    assert result.returncode == 2 and result.stderr == (
        f"jaxformer sweep: error: {path}: the spec has no name:, and its file name 'my sweep' is no plain name of "
        "letters, digits, '.', '_' and '-' to stand for one; add name: NAME\n"), result.stderr
    (tmp_path / "my-sweep.yaml").write_text(yaml.safe_dump(spec))
    assert load_spec(tmp_path / "my-sweep.yaml").name == "my-sweep"


def test_unreachable_ray_address_exits_2_before_any_run(tmp_path):
    result = jaxformer("sweep", TINY, "--out", tmp_path / "out", "--executor", "ray", "--ray-address", "127.0.0.1:1")
    assert result.returncode == 2 and "cannot reach Ray" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_launch_beside_another_that_holds_runs_exits_0_and_leaves_the_fit_to_it(tmp_path):
    """Two launches on one directory: the one that finishes first says how many runs are elsewhere and fits nothing."""
    from jaxformer.sweep.runs import RunPaths, run_lock

    spec = variant(tmp_path, "shared", isoflop={"budgets": [1e9], "params": [8e3, 16e3]})
    out = tmp_path / "out"
    held = plan_runs(load_spec(spec))[1].name
    with run_lock(RunPaths(out, held)) as holding:  # "another launch" training one of the two runs
        assert holding
        result = jaxformer("sweep", spec, "--out", out, "--workers", 1)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 runs still training in another launch" in result.stdout
    assert not (out / "results.csv").exists() and not (out / "fit").exists()
    assert (out / "runs").joinpath(plan_runs(load_spec(spec))[0].name, "final.json").is_file()


def test_a_plan_that_repeats_its_data_says_so_before_training(tmp_path):
    spec = variant(tmp_path, "repeats", isoflop={"budgets": [1e12], "params": [8e3]})
    result = jaxformer("sweep", spec, "--dry-run", "--no-probe")
    assert result.returncode == 0, result.stderr
    assert "note: 1 of 1 runs see the training split (about 1.91e+05 tokens) more than once, up to 94" in result.stdout
    assert "more than once" not in jaxformer("sweep", TINY, "--dry-run", "--no-probe").stdout


def test_results_carry_both_flop_counts_and_the_epochs_seen(tiny_sweep):
    out, _ = tiny_sweep
    for row in json.loads(jaxformer("results", out, "--format", "json").stdout):
        assert row["flops_rule"] == "6ND" and row["C"] == row["C_6nd"] and row["C_exact"] > row["C_6nd"]
        final = json.loads((out / "runs" / row["run"] / "final.json").read_text())
        assert row["epochs"] == final["epochs"] == pytest.approx(final["tokens"] / final["data"]["train_tokens"])


def test_sizes_centred_per_budget_follow_the_prior_law(tmp_path):
    spec = variant(tmp_path, "centred", isoflop={"budgets": [1e9, 4e9], "center": {
        "n_opt": 20e3, "budget": 1e9, "exponent": 0.5, "span": 4.0, "sizes": 3}})
    runs = plan_runs(load_spec(spec))
    targets = {budget: sorted(run.target_params for run in runs if run.budget == budget) for budget in (1e9, 4e9)}
    assert targets[1e9] == pytest.approx([10e3, 20e3, 40e3])  # a factor span around N_opt, log-even
    assert targets[4e9] == pytest.approx([20e3, 40e3, 80e3])  # N_opt ∝ C^0.5: twice as large at 4× compute
    for budget in (1e9, 4e9):
        sizes = sorted(run.N for run in runs if run.budget == budget)
        assert sizes[0] < sizes[1] < sizes[2]
    bad = variant(tmp_path, "both", isoflop={"budgets": [1e9], "params": [8e3], "center": {"n_opt": 1e4, "budget": 1e9}})
    with pytest.raises(ValueError, match="exactly one of params"):
        load_spec(bad)


def test_min_layers_keeps_the_size_rule_off_one_layer_models():
    base = get_preset("tiny")
    rule = ShapeRule(head_dim=16, aspect_ratio=16, max_layers=4)  # sweeps/quick-8x.yaml's rule
    one_layer = shape_for_params(21600, base, rule)  # d32 L1 (aspect 32) beats d16 L4 (aspect 4)
    assert (one_layer.num_layers, one_layer.d_model, count_params(one_layer).total) == (1, 32, 21600)
    two_or_more = dataclasses.replace(rule, min_layers=2)
    deeper = shape_for_params(21600, base, two_or_more)
    assert (deeper.num_layers, deeper.d_model, count_params(deeper).total) == (4, 16, 20624)
    for target in (12368, 16496, 34976, 95568):  # where the rule already picks 2+ layers, nothing changes
        assert shape_for_params(target, base, rule) == shape_for_params(target, base, two_or_more), target


def test_the_default_size_rule_holds_width_near_16_times_depth():
    """ShapeRule()'s aspect ratio is 16: of the depths whose nearest width lands within 15% of the target, the one
    whose d_model / num_layers is nearest 16 (an aspect of 24 picked 3 x 80, 5 x 128 and 8 x 176 here)."""
    shapes = [shape_for_params(target, get_preset("tiny"), ShapeRule()) for target in (3e5, 1e6, 3e6)]
    assert [(s.num_layers, s.d_model, count_params(s).total) for s in shapes] == [
        (5, 64, 283_328), (7, 112, 1_134_224), (10, 160, 3_218_720)]
    # no shape within 15% of 10,000 or 10,600 (between 1 x 16's 8,240 and 2 x 16's 12,368): the nearer count
    nearest = [shape_for_params(target, get_preset("tiny"), ShapeRule()) for target in (10_000, 10_600)]
    assert [count_params(s).total for s in nearest] == [8_240, 12_368]
    # its other bounds: one layer at least, 12 at most, heads of width 16, up to 64 of them
    with pytest.raises(ValueError, match="^shape rule gives too few layers for params=1000: one layer of width 16 "
                                         "already holds 8,240 parameters$"):
        shape_for_params(1e3, get_preset("tiny"), ShapeRule())
    with pytest.raises(ValueError, match=r"^shape rule cannot reach params=1e\+09: 12 layers \(shape.max_layers\) "
                                         r"of up to 64 heads \(shape.max_heads\) of width 16 hold at most "
                                         "152,069,120 parameters$"):
        shape_for_params(1e9, get_preset("tiny"), ShapeRule())


def test_the_dry_run_probe_times_runs_whose_kernels_are_chosen_per_machine(tmp_path):
    """The main job's spec sets both kernel choices to ``auto``: the probe resolves them as training does."""
    spec = variant(tmp_path, "auto-kernels", base={**yaml.safe_load(TINY.read_text())["base"],
                                                   "kernel": {"attention_impl": "auto", "matmul_impl": "auto"}},
                   isoflop={"budgets": [1e9], "params": [8e3], "flops": "6ND"})
    result = jaxformer("sweep", spec, "--dry-run", "--workers", 1)
    assert result.returncode == 0, result.stderr
    minutes = [line.split()[-1] for line in result.stdout.splitlines() if line.startswith("C1e09")]
    assert len(minutes) == 1 and float(minutes[0]) > 0
    assert "ETA ≈" in result.stdout
