"""The sweep runner end to end: plan, local and Ray executors, resume after SIGKILL, failure isolation, bad input."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from jaxformer.accounting import count_params
from jaxformer.models.presets import get_preset
from jaxformer.sweep.plan import plan_runs
from jaxformer.sweep.sizing import ShapeRule, shape_for_params
from jaxformer.sweep.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "sweeps" / "tiny.yaml"


def jaxformer(*args, cwd=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "jaxformer.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, **kwargs)


def variant(tmp_path: Path, name: str, **changes) -> Path:
    """A copy of sweeps/tiny.yaml with top-level sections replaced."""
    spec = yaml.safe_load(TINY.read_text())
    spec.update(name=name, **changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_plan_has_exact_counts_whole_steps_and_isoflop_compute():
    runs = plan_runs(load_spec(TINY))
    assert len(runs) == 4
    for run in runs:
        tokens_per_step = run.config["train"]["batch_size"] * run.config["train"]["seq_len"]
        assert run.D % tokens_per_step == 0 and run.steps == run.D // tokens_per_step
        assert run.C == 6 * run.N * run.D
        assert abs(run.C / run.budget - 1) < 0.03  # whole steps: within a step of the budget
        assert run.config["train"]["tokens"] == run.D
    assert len({run.N for run in runs}) == 2


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
    again = jaxformer("sweep", spec, "--out", out)
    assert "0 to train" in again.stdout
    retried = jaxformer("sweep", spec, "--out", out, "--retry-failed")
    assert "1 to train" in retried.stdout


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
])
def test_bad_specs_exit_2_with_one_line_before_any_run(tmp_path, changes, message):
    spec = variant(tmp_path, "bad", **changes)
    result = jaxformer("sweep", spec, "--out", tmp_path / "out")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


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


def test_one_runs_prediction_interval_adds_the_seed_noise_to_the_laws():
    """The held-out check's interval for one run: each bootstrap law's loss times 1 + noise·z. Its half-width is
    the law's and the seed's combined in quadrature (normal percentiles), and without noise there is none."""
    from jaxformer.scaling.allocation import PRESETS
    from jaxformer.scaling.report import fit_table
    from jaxformer.scaling.synthetic import isoflop_sweep
    from jaxformer.sweep.verify import predict

    law = PRESETS["chinchilla"]
    report = fit_table(isoflop_sweep(law, np.logspace(18, 21, 7), noise=0.002), "3", resamples=100, seed=0)
    N = float(law.n_opt(1e22))
    D = 1e22 / (6 * N)
    assert predict(report, N, D)["prediction_interval"] is None
    found = predict(report, N, D, noise=0.02)
    (low, high), (one_low, one_high) = found["interval"], found["prediction_interval"]
    assert found["loss"] == pytest.approx(float(report.approach3.law.loss(N, D))) and found["seed_noise"] == 0.02
    law_sd = (high - low) / (2 * 1.96 * found["loss"])
    expected = 1.96 * (law_sd ** 2 + 0.02 ** 2) ** 0.5 * found["loss"]
    assert (one_high - one_low) / 2 == pytest.approx(expected, rel=0.05)
    assert one_low < low < high < one_high
    mean_low, mean_high = predict(report, N, D, noise=0.02, runs=4)["prediction_interval"]  # four seeds' mean
    expected = 1.96 * (law_sd ** 2 + 0.01 ** 2) ** 0.5 * found["loss"]
    assert (mean_high - mean_low) / 2 == pytest.approx(expected, rel=0.05)
    assert one_low < mean_low < low < high < mean_high < one_high


def test_held_out_sizes_train_at_every_seed_and_their_mean_is_judged(tmp_path):
    """A sweep with ``seeds: [0, 1]`` trains each held-out size at both seeds (``verify.seeds`` defaults to the
    sweep's) and judges their mean loss, against the prediction interval for the mean of two runs.

    Every run's final loss, the held-out ones' too, is written from a known law before the launch, so the sweep
    trains nothing and every figure in verify.json is known."""
    from jaxformer.scaling.allocation import ParametricLaw
    from jaxformer.sweep.fit import fit_sweep
    from jaxformer.sweep.results import collect
    from jaxformer.sweep.verify import plan_verify, predict

    truth = ParametricLaw(E=1.0, A=200.0, B=168.5, alpha=0.35, beta=0.35)
    path = variant(tmp_path, "two-seeds", seeds=[0, 1], isoflop={"budgets": [1e9, 2e9, 4e9],
                                                                "params": [8e3, 16e3, 32e3, 64e3], "flops": "6ND"},
                   fit={"approaches": [2, 3], "bootstrap": 20}, verify={"factor": 2, "sizes": [1, 2]})
    spec, out = load_spec(path), tmp_path / "out"
    runs = plan_runs(spec)

    def finish(run, loss):
        final = {"params": run.N, "params_non_embedding": run.N_non_embedding, "tokens": run.D,
                 "flops_exact": run.C_exact, "flops_6nd": run.C_6nd, "val_loss": loss}
        (out / "runs" / run.name).mkdir(parents=True)
        (out / "runs" / run.name / "final.json").write_text(json.dumps(final))

    for run in runs:  # seed 1 0.4% above seed 0
        finish(run, float(truth.loss(run.N, run.D)) * (1 + 0.004 * run.seed))
    unverified = tmp_path / "unverified.yaml"
    unverified.write_text(yaml.safe_dump({k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "verify"}))
    assert jaxformer("sweep", unverified, "--out", out).returncode == 0  # the sweep's plan.json, nothing to train
    _, fitted = fit_sweep(out, collect(out), spec.fit)
    held_out = plan_verify(spec, runs, fitted)
    assert [run.seed for run in held_out] == [0, 1, 0, 1]
    assert held_out[0].N == held_out[1].N < held_out[2].N == held_out[3].N  # the compute-optimal size first
    losses = {run.name: float(truth.loss(run.N, run.D)) * (1.02 if run.seed == 0 else 0.99) for run in held_out}
    for run in held_out:
        finish(run, losses[run.name])
    result = jaxformer("sweep", path, "--out", out, "--workers", 1)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verify: 4 held-out runs at C = 8e+09" in result.stdout and "0 to train" in result.stdout.split("verify:")[1]
    verify = json.loads((out / "fit" / "verify.json").read_text())
    assert verify["runs"] == [held_out[0].name, held_out[1].name] and verify["seeds"] == [0, 1]
    assert verify["run"] == held_out[0].name and len(verify["neighbours"]) == 1
    assert verify["losses"] == [losses[held_out[0].name], losses[held_out[1].name]]
    assert verify["measured_loss"] == pytest.approx(np.mean(verify["losses"]), rel=1e-12)
    predicted = verify["predicted"]["loss"]
    assert verify["relative_errors"] == pytest.approx([loss / predicted - 1 for loss in verify["losses"]])
    assert verify["relative_error"] == pytest.approx(verify["measured_loss"] / predicted - 1)
    noise = verify["predicted"]["seed_noise"]  # the sweep's two seeds, 0.4% apart
    assert noise == pytest.approx(0.004 / 2 ** 0.5 / 1.002, rel=1e-9)
    assert verify["predicted"] == predict(fitted, verify["N"], verify["D"], noise, runs=2)
    assert verify["predicted"]["prediction_runs"] == 2
    assert "prediction interval for the mean of 2 runs" in result.stdout
    assert f"held-out runs {held_out[0].name}, {held_out[1].name} (each " in result.stdout


def test_held_out_run_and_seed_repeats_after_the_fit(tmp_path):
    """``verify:`` trains the compute-optimal run the fitted law predicts at 2× the largest budget and compares
    its loss with the law's; ``isoflop.repeat`` adds a second seed at one budget and the fit reports the noise.

    The sweep's own runs are given final losses from a known law (so the fit and its N_opt are known); the
    held-out run is planned from that fit and trained for real.
    """
    from jaxformer.scaling.allocation import ParametricLaw
    from jaxformer.sweep.verify import TOLERANCE

    truth = ParametricLaw(E=1.0, A=200.0, B=168.5, alpha=0.35, beta=0.35)  # N_opt 16K at 1e9 … 47K at 8e9
    spec = variant(tmp_path, "verified", isoflop={"budgets": [1e9, 2e9, 4e9], "params": [8e3, 16e3, 32e3, 64e3],
                                                  "flops": "6ND", "repeat": {"budget": 2e9, "seeds": [1]}},
                   fit={"approaches": [2, 3], "bootstrap": 20}, verify={"factor": 2, "sizes": [0.5, 1, 2]})
    runs = plan_runs(load_spec(spec))
    assert len(runs) == 16 and sorted(run.seed for run in runs if run.budget == 2e9) == [0] * 4 + [1] * 4
    out = tmp_path / "out"
    for k, run in enumerate(runs):  # "trained": final losses of the known law, 0.3% apart between seeds
        loss = float(truth.loss(run.N, run.D)) * (1 + 0.003 * run.seed * (-1) ** k)
        final = {"params": run.N, "params_non_embedding": run.N_non_embedding, "tokens": run.D,
                 "flops_exact": run.C_exact, "flops_6nd": run.C_6nd, "val_loss": loss}
        (out / "runs" / run.name).mkdir(parents=True)
        (out / "runs" / run.name / "final.json").write_text(json.dumps(final))
    result = jaxformer("sweep", spec, "--out", out, "--workers", 2)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 to train" in result.stdout and "seed noise: 4 shapes trained with several seeds" in result.stdout
    fit = json.loads((out / "fit" / "fit.json").read_text())
    law = ParametricLaw.from_dict(fit["approach3"]["params"])
    assert law.a == pytest.approx(truth.a, abs=0.02) and fit["warnings"] == []
    verify = json.loads((out / "fit" / "verify.json").read_text())
    assert verify["budget"] == 8e9 and verify["run"].startswith("verify-C8e09-N")
    assert abs(verify["N"] / float(law.n_opt(8e9)) - 1) <= 0.25  # the size rule's nearest shape
    assert verify["D"] * 6 * verify["N"] == pytest.approx(8e9, rel=0.03)  # whole steps of the budget's tokens
    assert verify["predicted"]["loss"] == pytest.approx(float(law.loss(verify["N"], verify["D"])), rel=1e-12)
    low, high = verify["predicted"]["interval"]
    assert low < verify["predicted"]["loss"] < high
    final = json.loads((out / "runs" / verify["run"] / "final.json").read_text())  # trained here, for real
    assert verify["measured_loss"] == final["val_loss"] and final["tokens"] == verify["D"]
    assert verify["within_tolerance"] == (abs(final["val_loss"] / verify["predicted"]["loss"] - 1) <= TOLERANCE)
    assert verify["inside_interval"] == (low <= final["val_loss"] <= high)
    repeats = {}  # the seed noise the sweep measured: two seeds of 4 shapes at 2e9, 0.3% apart
    for row in json.loads(jaxformer("results", out, "--format", "json").stdout):
        repeats.setdefault((row["N"], row["D"]), []).append(row["loss"])
    noise = np.median([np.std(v, ddof=1) / np.mean(v) for v in repeats.values() if len(v) > 1])
    assert verify["predicted"]["seed_noise"] == pytest.approx(noise) and noise == pytest.approx(0.003 / 2 ** 0.5, rel=0.01)
    one_low, one_high = verify["predicted"]["prediction_interval"]
    assert one_low < low and high < one_high  # one run's interval holds the law's and the seed's noise
    assert verify["inside_prediction_interval"] == (one_low <= final["val_loss"] <= one_high)
    assert "prediction interval for one run" in result.stdout
    assert f"held-out run {verify['run']}" in result.stdout
    assert verify["run"] not in (out / "results.csv").read_text()  # held out: no table or fit of the sweep has it
    held_out = sorted([verify, *verify["neighbours"]], key=lambda c: c["N"])  # half and twice N_opt around it
    assert len(held_out) == 3 and held_out[1]["run"] == verify["run"]
    assert held_out[0]["N"] < verify["N"] < held_out[2]["N"]
    assert all(6 * c["N"] * c["D"] == pytest.approx(8e9, rel=0.03) for c in held_out)  # one budget
    u, losses = np.log([c["N"] for c in held_out]), [c["measured_loss"] for c in held_out]
    p2, p1, _ = np.polyfit(u, losses, 2)
    vertex = -p1 / (2 * p2)
    expected = float(np.exp(vertex)) if p2 > 0 and u[0] < vertex < u[2] else None
    assert verify["measured_n_opt"] == (None if expected is None else pytest.approx(expected))
    assert verify["predicted_n_opt"] == pytest.approx(float(law.n_opt(8e9)))
    from matplotlib.image import imread

    for name in ("isoflop", "n_opt", "contour", "residuals"):  # the fit's figures open, and are not blank
        assert imread(out / "fit" / f"{name}.png").std() > 0.05, name
    again = jaxformer("sweep", spec, "--out", out)
    assert again.returncode == 0 and "3 held-out runs at C = 8e+09" in again.stdout, again.stdout
    assert "0 to train" in again.stdout.split("verify:")[1]
    assert json.loads((out / "fit" / "verify.json").read_text()) == verify


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
