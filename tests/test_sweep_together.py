"""A sweep's ``together: true``: a tuning stage's rates of one size train as one program in one worker request (and in
one Ray actor request); a worker that dies during a group leaves its runs to train alone, resuming."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from jaxformer.cli import main
from jaxformer.sweep.executors import thread_environment
from jaxformer.sweep.launch import together_groups
from jaxformer.sweep.runs import RunPaths
from jaxformer.sweep.tune import plan_tuning
from jaxformer.sweep.spec import load_spec
from jaxformer.sweep.worker import WarmWorker, train_group_here

ROOT = Path(__file__).resolve().parents[1]


def together_spec(tmp_path: Path) -> Path:
    """sweeps/tiny.yaml with a tuning stage of 3 rates × 2 sizes (40 and 20 steps) trained together."""
    spec = yaml.safe_load((ROOT / "sweeps" / "tiny.yaml").read_text())
    del spec["hyperparameters"]
    spec["base"]["checkpoint"]["interval"] = 1000
    spec.update(name="together", together=True, isoflop={"budgets": [1e9], "params": [8e3, 16e3], "flops": "6ND"},
                tune={"budget": 5e8, "params": [8e3, 16e3], "lr": [3e-3, 1e-2, 3e-2]})
    path = tmp_path / "together.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_tuning_stage_trains_each_size_together_and_a_relaunch_trains_nothing(tmp_path, capsys):
    spec_path, out = together_spec(tmp_path), tmp_path / "out"
    runs = plan_tuning(load_spec(spec_path))
    groups = together_groups(runs, [run.name for run in runs])
    assert groups == [tuple(run.name for run in runs[:3]), tuple(run.name for run in runs[3:])]  # by size

    assert main(["tune", str(spec_path), "--out", str(out), "--workers", "1"]) == 0, capsys.readouterr()
    stage = out / "tune"
    record = json.loads((stage / "tune.json").read_text())
    assert [r["status"] for r in record["runs"]] == ["done"] * 6
    for group in groups:
        for name in group:
            final = json.loads((stage / "runs" / name / "final.json").read_text())
            assert final["trained_with"] == [other for other in group if other != name]
            assert final["trained_as"] == "map"  # on a CPU (jaxformer.train.together.default_stacking)
            lr = yaml.safe_load((stage / "configs" / f"{name}.yaml").read_text())["optimizer"]["lr"]
            rows = [json.loads(line) for line in (stage / "runs" / name / "metrics.jsonl").read_text().splitlines()]
            assert rows[-1]["lr"] == pytest.approx(0.1 * lr)  # its own schedule's end
            assert next(r for r in record["runs"] if r["run"] == name)["loss"] == final["val_loss"]
        first = (stage / "logs" / f"{group[0]}.log").read_text()
        assert f"together with {', '.join(group[1:])}" in first
        second = (stage / "logs" / f"{group[1]}.log").read_text()
        assert f"the output is in {stage / 'logs' / f'{group[0]}.log'}" in second
    assert len({json.loads((stage / "runs" / name / "final.json").read_text())["val_loss"] for name in groups[0]}) == 3
    workers = {re.search(r"\(worker (\d+)\)", (stage / "logs" / f"{group[0]}.log").read_text())[1] for group in groups}
    assert len(workers) == 1  # one warm process trained both groups

    before = {p: p.stat().st_mtime_ns for p in (stage / "runs").glob("*/final.json")}
    assert main(["tune", str(spec_path), "--out", str(out)]) == 0
    assert "nothing to train" in capsys.readouterr().out
    outcomes = train_group_here(stage, list(groups[0]))  # a worker asked for the group again: all finished
    assert [o.status for o in outcomes] == ["skipped"] * 3
    assert before == {p: p.stat().st_mtime_ns for p in (stage / "runs").glob("*/final.json")}


# 96 steps, a checkpoint every 4: a worker killed after the first ones leaves work to resume
RUN = {"model": {"preset": "tiny", "d_model": 32, "num_layers": 1, "num_heads": 2, "max_seq_len": 64},
       "data": {"corpus": "synthetic-markov", "markov": {"bytes": 200000}},
       "train": {"batch_size": 8, "seq_len": 32, "tokens": 24576, "eval_tokens": 2048, "compilation_cache": "",
                 "peak_flops": 1e10},
       "checkpoint": {"interval": 4}, "logging": {"interval": 4, "tensorboard": False}}


@pytest.mark.slow
def test_a_worker_killed_during_a_group_leaves_its_runs_to_train_alone_resuming(tmp_path):
    names = ["lr-a", "lr-b"]
    for name, lr in zip(names, (1e-3, 1e-2)):
        path = RunPaths(tmp_path, name).config
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({**RUN, "optimizer": {"lr": lr}}))
    worker = WarmWorker(thread_environment(1), tmp_path / "logs" / "worker.log")
    result = []
    thread = threading.Thread(target=lambda: result.extend(worker.train_group(tmp_path, names)))
    thread.start()
    deadline = time.time() + 600
    while not all((tmp_path / "runs" / name / "checkpoints" / "8").is_dir() for name in names):
        assert time.time() < deadline and thread.is_alive()
        time.sleep(0.05)
    pid = int(RunPaths(tmp_path, names[0]).lock.read_text())  # the worker holds every lock of the group
    assert pid == int(RunPaths(tmp_path, names[1]).lock.read_text())
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=900)
    worker.close()
    assert [(o.name, o.status) for o in result] == [(name, "done") for name in names]
    for name in names:
        final = json.loads((tmp_path / "runs" / name / "final.json").read_text())
        assert final["resumed_from"]["step"] >= 8 and "trained_with" not in final  # alone, from its checkpoint
        log = RunPaths(tmp_path, name).log.read_text()
        assert log.count("$ jaxformer train") == (2 if name == names[0] else 1)


def seeds_spec(tmp_path: Path) -> Path:
    """Two seeds of one size at each of two budgets: two groups of two."""
    spec = yaml.safe_load((ROOT / "sweeps" / "tiny.yaml").read_text())
    spec.update(name="seeds-together", together=True, seeds=[0, 1],
                isoflop={"budgets": [1e9, 2e9], "params": [8e3], "flops": "6ND"})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_dry_run_says_which_runs_train_together(tmp_path, capsys):
    assert main(["sweep", str(seeds_spec(tmp_path)), "--dry-run", "--no-probe"]) == 0
    assert "together: 4 runs in 2 worker requests, each group one program (2 of 2 runs)" in capsys.readouterr().out


def test_the_ray_executor_trains_a_group_in_one_actor_request(tmp_path):
    """A group trained as one program by a Ray actor."""
    path, out = seeds_spec(tmp_path), tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "jaxformer.cli", "sweep", str(path), "--out", str(out),
                             "--executor", "ray", "--workers", "1"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "together: 4 runs in 2 worker requests" in result.stdout
    finals = {p.parent.name: json.loads(p.read_text()) for p in (out / "runs").glob("*/final.json")}
    assert sorted(finals) == ["C1e09-N8240-s0", "C1e09-N8240-s1", "C2e09-N8240-s0", "C2e09-N8240-s1"]
    for name, final in finals.items():
        partner = name.replace("-s0", "-s1") if name.endswith("-s0") else name.replace("-s1", "-s0")
        assert final["trained_with"] == [partner]
    assert finals["C1e09-N8240-s0"]["val_loss"] != finals["C1e09-N8240-s1"]["val_loss"]  # each its own seed
