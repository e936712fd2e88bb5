"""WSD trunks and cooldown branches (#17): a branch equals a straight run bit for bit; a branched sweep end to end."""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from jaxformer.sweep.branches import BranchCompute, copy_fork, trunk_config, trunks_of
from jaxformer.sweep.launch import plan_table
from jaxformer.sweep.plan import fork_step, plan_run, plan_runs
from jaxformer.sweep.results import collect
from jaxformer.sweep.runs import RunPaths, run_lock
from jaxformer.sweep.spec import load_spec
from jaxformer.train.config import config_to_dict, load_config
from jaxformer.train.loop import train
from jaxformer.train.optimizer import learning_rates

ROOT = Path(__file__).resolve().parents[1]
# 256 tokens a step, a warmup of 10 steps; the fork steps (31, 47) are no log, evaluation or checkpoint step
TINY = ["model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.max_seq_len=64",
        "data.corpus=synthetic-markov", "data.markov.bytes=200000", "train.batch_size=8", "train.seq_len=32",
        "train.eval_tokens=2048", "train.eval_interval=10", "logging.interval=5", "checkpoint.interval=25",
        "checkpoint.keep=1", "logging.progress=none", "logging.tensorboard=false",
        "train.peak_flops=1e10", "optimizer.schedule=wsd", "optimizer.warmup_tokens=2560",
        "optimizer.cooldown_fraction=0.2", "optimizer.lr=1e-2"]
CURVE_KEYS = ("step", "tokens", "train_loss", "grad_norm", "lr", "val_loss", "val_bits_per_byte")


def _curve(run_dir: Path) -> list[tuple]:
    """The rows with a loss (a save-only row holds no loss, and saves fall at other steps in a trunk)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [tuple(row.get(key) for key in CURVE_KEYS) for row in rows if "train_loss" in row or "val_loss" in row]


def _digest(run_dir: Path, step: int) -> str:
    """The digest of every array of the state (parameters, AdamW moments, step, loss sums) saved at ``step``."""
    return json.loads((run_dir / "checkpoints" / str(step) / "meta" / "metadata").read_text())["digest"]


def test_a_branch_continued_from_its_trunk_equals_a_straight_wsd_run_bit_for_bit(tmp_path):
    long, short = (load_config(None, [*TINY, f"train.tokens={steps * 256}"]) for steps in (60, 40))
    forks = [fork_step(long), fork_step(short)]
    assert forks == [60 - 12 - 1, 40 - 8 - 1]  # S − cooldown − 1: the last update at the peak exactly
    trunk = trunk_config(config_to_dict(long), forks)
    assert trunk.total_steps == 48 and trunk.optimizer.schedule == "constant" and trunk.checkpoint.steps == [31, 47]
    trunk_lrs = learning_rates(trunk.optimizer, 48, 256)
    for config, fork in ((long, 47), (short, 31)):
        lrs = learning_rates(config.optimizer, config.total_steps, 256)
        np.testing.assert_array_equal(trunk_lrs[:fork], lrs[:fork])
        # the branch's first update reads the cooldown's start (the peak up to rounding), then it decays
        assert lrs[fork - 1] == np.float32(1e-2) and lrs[fork] == pytest.approx(1e-2) and lrs[fork + 1] < 1e-2
    train(trunk, tmp_path / "trunk")
    saved = sorted(int(p.name) for p in (tmp_path / "trunk" / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == [31, 47, 48]  # both forks kept past checkpoint.keep=1; interval saves rotated away
    for config, fork, name in ((long, 47, "long"), (short, 31, "short")):
        straight = train(config, tmp_path / f"straight-{name}")
        copy_fork(tmp_path / "trunk", fork, tmp_path / f"branch-{name}")
        branch = train(config, tmp_path / f"branch-{name}")
        steps = config.total_steps
        assert branch["resumed_from"]["step"] == fork and straight["resumed_from"] is None
        assert _digest(tmp_path / f"branch-{name}", steps) == _digest(tmp_path / f"straight-{name}", steps)
        assert _curve(tmp_path / f"branch-{name}") == _curve(tmp_path / f"straight-{name}")
        assert (branch["val_loss"], branch["train_loss"]) == (straight["val_loss"], straight["train_loss"])
        fork_record = json.loads((tmp_path / f"branch-{name}" / "fork.json").read_text())
        assert fork_record["trunk"] == "trunk" and fork_record["step"] == fork
        assert fork_record["digest"] == _digest(tmp_path / "trunk", fork)


def test_a_fork_keeps_the_trunks_rows_to_its_step_and_a_copy_cut_short_is_made_again(tmp_path):
    """The branch gets the trunk's metrics rows up to the fork step, that step's row included (where it is a log
    step); a copy cut short (its staging folder and an empty checkpoints/ left behind) is made again."""
    trunk, branch = tmp_path / "trunk", tmp_path / "branch"
    (trunk / "checkpoints" / "10" / "meta").mkdir(parents=True)
    (trunk / "checkpoints" / "10" / "meta" / "metadata").write_text(json.dumps({"digest": "d10"}))
    (trunk / "checkpoints" / "10" / "state").write_bytes(b"trunk state at 10")
    (trunk / "data.json").write_text('{"corpus": "trunk"}')
    rows = [{"step": step, "train_loss": 4.0} for step in (5, 10, 15)]
    (trunk / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (branch / ".fork-10" / "meta").mkdir(parents=True)
    (branch / "checkpoints").mkdir()
    copy_fork(trunk, 10, branch)
    assert [json.loads(row)["step"] for row in (branch / "metrics.jsonl").read_text().splitlines()] == [5, 10]
    assert (branch / "checkpoints" / "10" / "state").read_bytes() == b"trunk state at 10"
    assert not (branch / ".fork-10").exists() and (branch / "data.json").read_text() == '{"corpus": "trunk"}'
    assert json.loads((branch / "fork.json").read_text()) == {
        "trunk": "trunk", "step": 10, "checkpoint": str(trunk / "checkpoints" / "10"), "digest": "d10"}


def _spec(tmp_path: Path, name: str, optimizer: dict | None = None, **changes) -> Path:
    """sweeps/tiny.yaml with branches, its base on ``optimizer`` (default: WSD with a warmup of 4 steps),
    top-level sections replaced by ``changes``."""
    spec = yaml.safe_load((ROOT / "sweeps" / "tiny.yaml").read_text())
    spec["base"]["optimizer"] = optimizer or {"schedule": "wsd", "warmup_tokens": 1024, "cooldown_fraction": 0.2}
    spec.update(name=name, branches=True, **changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def jaxformer(*args):
    return subprocess.run([sys.executable, "-m", "jaxformer.cli", *map(str, args)], capture_output=True, text=True)


def test_a_branched_sweep_trains_trunks_then_branches_and_isolates_a_failed_trunk(tmp_path):
    # the larger size diverges (lr 1e12, no clipping): its trunk fails, and with it only its own branches
    spec = _spec(tmp_path, "branched", hyperparameters={"optimizer.lr": "1e12 if N > 10000 else 3e-3",
                                                        "optimizer.grad_clip": 0})
    runs = plan_runs(load_spec(spec))
    trunks = trunks_of(runs)
    assert [trunk.name for trunk in trunks] == ["trunk-N8240-s0", "trunk-N16496-s0"]
    for trunk in trunks:
        branches = [run for run in runs if run.trunk == trunk.name]
        assert len(branches) == 2 and trunk.steps == max(run.fork_step for run in branches) + 1
        assert trunk.C == pytest.approx(6 * trunk.N * trunk.steps * 256, rel=1e-12)  # flops: 6ND
    for run in runs:
        assert run.fork_step == run.steps - round(0.2 * run.steps) - 1
    independent = sum(run.C for run in runs)
    branched = sum(trunk.C for trunk in trunks) + sum(run.C * (run.steps - run.fork_step) / run.steps for run in runs)
    compute = BranchCompute.of(runs, trunks)
    assert compute.independent == independent and compute.branched == pytest.approx(branched, rel=1e-12)
    assert compute.saved == pytest.approx(1 - branched / independent)
    # in steps: trunks of 126 and 63, cooldowns of 17 + 33 and 9 + 17, against runs of 79 + 158 and 39 + 79
    assert compute.saved == pytest.approx(1 - (8240 * 176 + 16496 * 89) / (8240 * 237 + 16496 * 118), rel=1e-9)
    dry = plan_table(runs, workers=2, probe=False)  # what `jaxformer sweep --dry-run` prints
    assert compute.line() in dry and f"{1 - branched / independent:.1%} saved" in dry
    assert "4 runs on 2 trunks, total compute" in dry and f"{runs[0].fork_step}→{runs[0].steps}" in dry
    assert dry.splitlines()[1].startswith("trunk-N8240-s0")

    out = tmp_path / "out"
    held = [run.name for run in runs if run.trunk == "trunk-N8240-s0"][1]
    with run_lock(RunPaths(out, held)) as holding:  # "another launch" on one branch: it is neither seeded nor trained
        assert holding
        result = jaxformer("sweep", spec, "--out", out, "--workers", 2)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 runs still training in another launch" in result.stdout and not (out / "runs" / held).exists()
    resumed = jaxformer("sweep", spec, "--out", out, "--workers", 2)  # the held branch, forked and trained now
    assert resumed.returncode == 1 and "1 to train" in resumed.stdout, resumed.stdout + resumed.stderr
    # the runs that finished or failed before count as such from the first line, the held one as queued
    assert f"[running 1 done 2 failed 3] {held}: running" in resumed.stdout, resumed.stdout
    assert f"[done 3 failed 3] {held}: done" in resumed.stdout
    assert "trunks: 2, 2 to train; each branch trains from its trunk's checkpoint once" in result.stdout
    assert compute.line() in result.stdout
    plan = json.loads((out / "plan.json").read_text())
    assert [trunk["name"] for trunk in plan["trunks"]] == [trunk.name for trunk in trunks]
    assert {run["name"]: (run["trunk"], run["fork_step"]) for run in plan["runs"]} == \
        {run.name: (run.trunk, run.fork_step) for run in runs}
    rows = {row["run"]: row for row in collect(out)}  # the results table
    assert sorted(rows) == sorted(run.name for run in runs)  # the branches, not the trunks
    for run in runs:
        if run.trunk == "trunk-N8240-s0":
            assert rows[run.name]["status"] == "done" and 0 < rows[run.name]["loss"] < 5.6
            final = json.loads((out / "runs" / run.name / "final.json").read_text())
            assert final["resumed_from"]["step"] == run.fork_step and final["steps"] == run.steps
            fork = json.loads((out / "runs" / run.name / "fork.json").read_text())
            assert (fork["trunk"], fork["step"]) == (run.trunk, run.fork_step)
            metrics = (out / "runs" / run.name / "metrics.jsonl").read_text().splitlines()
            metrics = [json.loads(line) for line in metrics]
            assert metrics[0]["step"] == 10 and metrics[-1]["step"] == run.steps  # the trunk's rows, then its own
        else:
            assert rows[run.name]["status"] == "failed"
            assert "its trunk trunk-N16496-s0 did not finish (NonFiniteLoss" in rows[run.name]["reason"]
            assert f"failed {run.name}: its trunk trunk-N16496-s0" in result.stdout
            assert not (out / "runs" / run.name / "checkpoints").exists()

    before = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/final.json")}
    again = jaxformer("sweep", spec, "--out", out)
    assert "0 to train" in again.stdout and "trunks: 2, 0 to train;" in again.stdout, again.stdout
    assert before == {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/final.json")}


@pytest.mark.parametrize("optimizer, hyperparameters, message", [
    ({"schedule": "cosine", "warmup_tokens": 1024}, {},
     "branches: true needs base optimizer.schedule: wsd (a stable phase to fork cooldowns from), got 'cosine'"),
    ({"schedule": "wsd"}, {}, "branches: true needs base optimizer.warmup_tokens (a warmup_fraction would make"),
    (None, {"optimizer.lr": "3e-3 * (D / 1e5) ** -0.1"},
     "hyperparameters.optimizer.lr: with branches: true, the branches of a trunk share it, so it may depend on "
     "N, d_model, num_layers, seed only, not on D or C (got '3e-3 * (D / 1e5) ** -0.1')"),
])
def test_branches_refuse_a_trunk_that_would_depend_on_d(tmp_path, optimizer, hyperparameters, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        load_spec(_spec(tmp_path, "bad", optimizer, hyperparameters=hyperparameters))


def test_a_cooldown_that_starts_inside_the_warmup_is_refused_naming_the_run(tmp_path):
    spec = _spec(tmp_path, "late", {"schedule": "wsd", "warmup_tokens": 20000})  # 78 steps
    with pytest.raises(ValueError, match="^" + re.escape("branches: run C1e09-N8240-s0's cooldown starts at update "
                                                         "63 of 79, before its warmup of 78 ends")):
        plan_runs(load_spec(spec))


def test_a_cooldown_may_start_right_after_the_warmup_and_not_one_update_sooner(tmp_path):
    one_size = {"budgets": [1e9], "params": [8e3], "flops": "6ND"}  # 79 updates of 256 tokens, forked after 62
    ends_at_fork = _spec(tmp_path, "edge", {"schedule": "wsd", "warmup_tokens": 62 * 256, "cooldown_fraction": 0.2},
                         isoflop=one_size)
    assert [(run.fork_step, run.steps) for run in plan_runs(load_spec(ends_at_fork))] == [(62, 79)]
    one_later = _spec(tmp_path, "past", {"schedule": "wsd", "warmup_tokens": 63 * 256, "cooldown_fraction": 0.2},
                      isoflop=one_size)
    with pytest.raises(ValueError, match="^" + re.escape("branches: run C1e09-N8240-s0's cooldown starts at update "
                                                         "63 of 79, before its warmup of 63 ends")):
        plan_runs(load_spec(one_later))


def test_a_warmup_in_tokens_unset_by_a_hyperparameter_is_refused_naming_the_run(tmp_path):
    spec = _spec(tmp_path, "unset", hyperparameters={"optimizer.lr": 3e-3, "optimizer.warmup_tokens": None})
    with pytest.raises(ValueError, match="^" + re.escape("branches: run C1e09-N8240-s0 trains with "
                                                         "optimizer.schedule=wsd, warmup_tokens=None; branches need")):
        plan_runs(load_spec(spec))


def _quick_filled(tmp_path: Path, **optimizer) -> Path:
    """sweeps/quick-8x.yaml (centred sizes, branches) with ``isoflop.fill: true`` and ``optimizer`` changes."""
    spec = yaml.safe_load((ROOT / "sweeps" / "quick-8x.yaml").read_text())
    spec["isoflop"]["fill"] = True
    spec["base"]["optimizer"].update(optimizer)
    path = tmp_path / "filled.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("warmup_tokens, skipped", [(16384, []), (200_000, ["C1.5e11-N95568-s0"])])
def test_fill_cools_each_trunk_down_at_the_other_budgets_it_reaches(tmp_path, warmup_tokens, skipped):
    spec = load_spec(_quick_filled(tmp_path, warmup_tokens=warmup_tokens))
    runs = plan_runs(spec)
    planned = {run.name for run in plan_runs(dataclasses.replace(spec, isoflop=dataclasses.replace(spec.isoflop,
                                                                                                   fill=False)))}
    # the centred sizes: 8240-34976 at 1.5e11, 12368-48352 at 3e11, 16496-67824 at 6e11, 21600-95568 at 1.2e12
    # (trunk lengths 1.95e6 … 1.41e6 tokens); a trunk reaches a lower budget's D, never a higher one's
    fills = ["C1.5e11-N48352-s0", "C1.5e11-N67824-s0", "C1.5e11-N95568-s0", "C3e11-N67824-s0", "C3e11-N95568-s0",
             "C6e11-N95568-s0"]
    assert sorted({run.name for run in runs} - planned) == sorted(set(fills) - set(skipped))
    assert planned <= {run.name for run in runs}
    for run in runs:
        alone = plan_run(spec, run.budget, run.target_params, run.seed, rule="exact")
        assert (run.N, run.D, run.C, run.steps, run.config) == (alone.N, alone.D, alone.C, alone.steps, alone.config)
        assert run.trunk == f"trunk-N{run.N}-s0" and run.fork_step == run.steps - round(0.2 * run.steps) - 1
    assert [(run.budget, run.N) for run in runs] == sorted((run.budget, run.N) for run in runs)  # launch order
    assert len(trunks_of(runs)) == 8  # fill adds no trunk and trains none further: each added run ends by its trunk's end
    assert {trunk.name: trunk.steps for trunk in trunks_of(runs)} == \
        {trunk.name: trunk.steps for trunk in trunks_of([run for run in runs if run.name in planned])}


def test_fill_without_branches_is_refused(tmp_path):
    path = _quick_filled(tmp_path)
    spec = yaml.safe_load(path.read_text())
    spec["branches"] = False
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match=r"^isoflop.fill needs branches: true \(it adds cooldowns to the sweep's "
                                         r"WSD trunks\)$"):
        load_spec(path)
