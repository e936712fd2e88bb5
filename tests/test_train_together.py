"""Runs trained together (`jaxformer.train.together`) equal the same runs trained alone: curves, schedules,
parameters, a divergence failing its run alone, resume, refusals, matmul choices."""

import json
import os
import shutil
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml
from process_helpers import free_port, last_lines

from jaxformer.train import kernel_choice
from jaxformer.train.attempt import attempt_run, attempt_together
from jaxformer.train.checkpoint import CheckpointError
from jaxformer.train.config import config_to_dict, load_config
from jaxformer.train.loop import NonFiniteLoss, train
from jaxformer.train.restore import restore_params
from jaxformer.train.together import together_conflict, together_groups, train_together

# 32 steps of 256 tokens, WSD (stable to step 26, then a linear cooldown to 0.1 lr); checkpoints every 8 steps
TINY = ["model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.max_seq_len=64",
        "data.corpus=synthetic-markov", "data.markov.bytes=200000", "train.batch_size=8", "train.seq_len=32",
        "train.tokens=8192", "train.eval_tokens=2048", "train.eval_interval=16", "checkpoint.interval=8",
        "logging.interval=4", "logging.progress=none", "logging.tensorboard=false", "train.compilation_cache=",
        "train.peak_flops=1e10", "optimizer.schedule=wsd", "optimizer.warmup_fraction=0.1"]
LRS = (1e-3, 3e-3, 1e-2)
CURVE = ("train_loss", "grad_norm", "val_loss", "val_bits_per_byte")
TIMING = ("wall_s", "compile_s", "time", "compiled", "tokens_per_s", "mfu", "resumed_from")


def configs(lrs=LRS, extra=()):
    """Run i: learning rate ``lrs[i]``, seed i (its own data order and initialisation)."""
    return [load_config(None, [*TINY, f"optimizer.lr={lr}", f"train.seed={seed}", *extra])
            for seed, lr in enumerate(lrs)]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final(run_dir: Path) -> dict:
    return json.loads((run_dir / "final.json").read_text())


def assert_same_run(together: Path, alone: Path, *, trained_with: bool = True) -> None:
    """Rows, final record and parameters of ``together`` equal ``alone``'s within fp32 tolerance; ``trained_with``:
    ``together`` was (its final.json says with whom)."""
    got, want = rows(together), rows(alone)
    assert [(r["step"], r["tokens"], r.get("lr")) for r in got] == [(r["step"], r["tokens"], r.get("lr")) for r in want]
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for key in set(CURVE) & w.keys():
            assert g[key] == pytest.approx(w[key], rel=1e-5)
    a, b = final(together), final(alone)
    assert a.keys() - b.keys() == ({"trained_with", "trained_as"} if trained_with else set())
    losses = ("train_loss", "val_loss", "val_bits_per_byte")
    skip = TIMING + losses + ("trained_with", "trained_as")
    assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}
    assert [a[k] for k in losses] == pytest.approx([b[k] for k in losses], rel=1e-5)
    assert a["time"].keys() == b["time"].keys()
    step_a, params_a = restore_params(together)
    step_b, params_b = restore_params(alone)
    assert step_a == step_b == 32
    for x, y in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> list[Path]:
    """The three runs trained alone: the reference every test here compares with."""
    root = tmp_path_factory.mktemp("alone")
    for i, config in enumerate(configs()):
        train(config, root / f"lr{i}")
    return [root / f"lr{i}" for i in range(len(LRS))]


@pytest.fixture(scope="module")
def together(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("together")
    run_dirs = [root / f"lr{i}" for i in range(len(LRS))]
    records = train_together(configs(), run_dirs)  # on a CPU: the runs in turn inside one program (lax.map)
    assert [r["trained_with"] for r in records] == [["lr1", "lr2"], ["lr0", "lr2"], ["lr0", "lr1"]]
    assert [r["trained_as"] for r in records] == ["map" if jax.default_backend() == "cpu" else "vmap"] * 3
    return run_dirs


def test_runs_trained_together_equal_the_same_runs_trained_alone(together, alone):
    for run_together, run_alone in zip(together, alone):
        assert sorted(p.name for p in run_together.iterdir()) == sorted(p.name for p in run_alone.iterdir())
        assert (run_together / "config.yaml").read_text() == (run_alone / "config.yaml").read_text()
        assert sorted(p.name for p in (run_together / "checkpoints").iterdir()) == ["16", "24", "32"]
        assert_same_run(run_together, run_alone)
    # each run kept its own schedule: the peak in the stable phase, 0.1 of it at the end
    for run_dir, lr in zip(together, LRS):
        by_step = {row["step"]: row for row in rows(run_dir)}
        assert by_step[8]["lr"] == pytest.approx(lr) and by_step[32]["lr"] == pytest.approx(0.1 * lr)
    assert len({final(run_dir)["val_loss"] for run_dir in together}) == 3  # three different runs
    times = [final(run_dir)["time"] for run_dir in together]
    assert times[0]["train_s"] == times[1]["train_s"] > 0  # one program: one shared breakdown
    assert sum(v for k, v in times[0].items() if k not in ("total_s", "startup_s", "other_s")) < times[0]["total_s"]


def test_runs_vmapped_together_equal_the_same_runs_trained_alone(tmp_path, alone):
    run_dirs = [tmp_path / f"lr{i}" for i in range(len(LRS))]
    records = train_together(configs(), run_dirs, stacked="vmap")
    assert [r["trained_as"] for r in records] == ["vmap"] * 3
    for run_together, run_alone in zip(run_dirs, alone):
        assert_same_run(run_together, run_alone)


def _write_configs(root: Path, runs) -> list[Path]:
    paths = []
    for i, config in enumerate(runs):
        paths.append(root / f"run{i}.yaml")
        paths[-1].write_text(yaml.safe_dump(config_to_dict(config)))
    return paths


def test_a_diverging_run_fails_alone_and_the_others_finish_as_they_would_alone(tmp_path, alone):
    lrs = (LRS[0], 1e10, LRS[2])  # the middle run's loss becomes non-finite within a few steps
    paths = _write_configs(tmp_path, configs(lrs))
    run_dirs = [tmp_path / "runs" / name for name in ("lr0", "diverges", "lr2")]
    attempts = attempt_together(paths, [], run_dirs)
    assert [a.status for a in attempts] == ["done", "failed", "done"]
    assert isinstance(attempts[1].error, NonFiniteLoss)
    assert_same_run(run_dirs[0], alone[0])
    assert_same_run(run_dirs[2], alone[2])
    assert final(run_dirs[0])["trained_with"] == ["diverges", "lr2"]

    lone = attempt_run(paths[1], [], tmp_path / "lone")  # the same run alone: the same record
    error, lone_error = (json.loads((d / "error.json").read_text()) for d in (run_dirs[1], tmp_path / "lone"))
    assert error["error"] == lone_error["error"] == "NonFiniteLoss"
    assert error["message"] == lone_error["message"].replace(str(tmp_path / "lone"), str(run_dirs[1]))
    assert "non-finite loss, gradient or parameters at step" in error["message"]
    assert not (run_dirs[1] / "final.json").exists() and lone.status == "failed"
    assert [r["step"] for r in rows(run_dirs[1])] == [r["step"] for r in rows(tmp_path / "lone")]
    assert sorted(p.name for p in (run_dirs[1] / "checkpoints").iterdir()) \
        == sorted(p.name for p in (tmp_path / "lone" / "checkpoints").iterdir())


def _interrupt(run_dir: Path, after: int) -> None:
    """What a kill after the checkpoint of step ``after`` leaves: no final.json, no later checkpoint."""
    (run_dir / "final.json").unlink()
    for step in (run_dir / "checkpoints").iterdir():
        if int(step.name) > after:
            shutil.rmtree(step)


def test_a_run_none_of_whose_checkpoints_reads_fails_alone_and_is_not_trained_from_step_0(tmp_path):
    paths = _write_configs(tmp_path, configs(LRS[:2], extra=["train.tokens=2048", "checkpoint.interval=4"]))
    run_dirs = [tmp_path / "runs" / f"lr{i}" for i in range(2)]
    assert [a.status for a in attempt_together(paths, [], run_dirs)] == ["done", "done"]  # 8 steps
    for run_dir in run_dirs:
        _interrupt(run_dir, 4)
    for chunk in (run_dirs[1] / "checkpoints").rglob("d/*"):
        chunk.write_bytes(b"\0" * chunk.stat().st_size)
    attempts = attempt_together(paths, [], run_dirs)
    assert [a.status for a in attempts] == ["done", "failed"] and attempts[1].kind == "CheckpointError"
    assert final(run_dirs[0])["resumed_from"]["step"] == 4
    error = json.loads((run_dirs[1] / "error.json").read_text())
    assert error["error"] == "CheckpointError" and error["message"].startswith("none of the checkpoints [4] in ")
    assert not (run_dirs[1] / "final.json").exists() and list((run_dirs[1] / "checkpoints").iterdir()) == []
    assert [p.name for p in (run_dirs[1] / "corrupt_checkpoints").iterdir()] == ["4"]


def test_the_others_of_a_group_whose_one_run_has_no_readable_checkpoint_resume_together(tmp_path, together, alone):
    """Three runs interrupted after step 16, the middle one's checkpoints all unreadable: it fails as it would alone
    (its steps set aside, never a restart from step 0), and the other two are regrouped: trained together from step
    16, ending as the uninterrupted runs trained alone."""
    run_dirs = [tmp_path / d.name for d in together]
    for source, target in zip(together, run_dirs):
        shutil.copytree(source, target)
        _interrupt(target, 16)
    for chunk in (run_dirs[1] / "checkpoints").rglob("d/*"):
        chunk.write_bytes(b"\0" * chunk.stat().st_size)
    records = train_together(configs(), run_dirs)
    assert isinstance(records[1], CheckpointError) and str(records[1]).startswith("none of the checkpoints [16] in ")
    assert [records[i]["trained_with"] for i in (0, 2)] == [["lr2"], ["lr0"]]  # the group of the two that read
    for i in (0, 2):
        assert final(run_dirs[i])["resumed_from"]["step"] == 16
        assert_same_run(run_dirs[i], alone[i])
    assert not (run_dirs[1] / "final.json").exists() and list((run_dirs[1] / "checkpoints").iterdir()) == []
    assert [p.name for p in (run_dirs[1] / "corrupt_checkpoints").iterdir()] == ["16"]


def test_an_interrupted_group_resumes_together_or_alone_and_ends_as_uninterrupted(tmp_path, together, alone):
    same = [tmp_path / "same" / d.name for d in together]
    for source, target in zip(together, same):
        shutil.copytree(source, target)
        _interrupt(target, 16)
    train_together(configs(), same)
    for run_dir, run_alone in zip(same, alone):
        assert final(run_dir)["resumed_from"]["step"] == 16 and "trained_with" in final(run_dir)
        assert_same_run(run_dir, run_alone)

    apart = [tmp_path / "apart" / d.name for d in together]
    for source, target, after in zip(together, apart, (16, 24, 16)):
        shutil.copytree(source, target)
        _interrupt(target, after)
    finished = final(together[2])
    shutil.copy(together[2] / "final.json", apart[2] / "final.json")  # and one of them had finished
    records = train_together(configs(), apart)  # steps 16 and 24: each alone, resuming its own checkpoints
    assert records[2] == finished
    for run_dir, run_alone, step in zip(apart[:2], alone, (16, 24)):
        assert final(run_dir)["resumed_from"]["step"] == step
        assert_same_run(run_dir, run_alone, trained_with=False)  # a lone run resumes a checkpoint written together

    last = [tmp_path / "last" / d.name for d in together]  # the others finished: the one left trains alone
    for source, target in zip(together, last):
        shutil.copytree(source, target)
    _interrupt(last[0], 16)
    records = train_together(configs(), last)
    assert records[1:] == [final(run_dir) for run_dir in together[1:]] and "trained_with" not in records[0]
    assert final(last[0])["resumed_from"]["step"] == 16
    assert_same_run(last[0], alone[0], trained_with=False)


def test_a_group_one_of_whose_newest_checkpoints_does_not_read_trains_alone_each_resuming(tmp_path, together, alone):
    """Interrupted after step 24, the middle run's checkpoint of step 24 unreadable: it falls back to step 16 (its
    24 set aside), so the restored steps differ and each run trains alone, ending as the uninterrupted one."""
    run_dirs = [tmp_path / d.name for d in together]
    for source, target in zip(together, run_dirs):
        shutil.copytree(source, target)
        _interrupt(target, 24)
    for chunk in (run_dirs[1] / "checkpoints" / "24").rglob("d/*"):
        chunk.write_bytes(b"\0" * chunk.stat().st_size)
    train_together(configs(), run_dirs)
    assert [final(run_dir)["resumed_from"]["step"] for run_dir in run_dirs] == [24, 16, 24]
    assert [p.name for p in (run_dirs[1] / "corrupt_checkpoints").iterdir()] == ["24"]
    for run_dir, run_alone in zip(run_dirs, alone):
        assert_same_run(run_dir, run_alone, trained_with=False)


def test_a_group_killed_after_its_last_checkpoint_is_evaluated_again_and_ends_as_uninterrupted(tmp_path, together,
                                                                                                alone):
    """Killed between the checkpoint of the last step and final.json: nothing is left to train, so each run's
    validation loss is computed again from that checkpoint, and every run ends as the uninterrupted one did."""
    run_dirs = [tmp_path / d.name for d in together]
    for source, target in zip(together, run_dirs):
        shutil.copytree(source, target)
        _interrupt(target, 32)
    records = train_together(configs(), run_dirs)
    for run_dir, source, run_alone, record in zip(run_dirs, together, alone, records):
        assert record == final(run_dir) and record["resumed_from"]["step"] == 32
        assert record["val_loss"] == pytest.approx(final(source)["val_loss"], rel=1e-6)
        assert_same_run(run_dir, run_alone)


@pytest.mark.parametrize(("change", "message"), [
    (["model.d_model=16"], "lr0 and lr1 cannot train together: model.d_model is 32 in one and 16 in the other"),
    (["train.tokens=4096"], "lr0 and lr1 cannot train together: train.tokens is 8192 in one and 4096 in the other"),
    (["optimizer.weight_decay=0.0"], "optimizer.weight_decay is 0.1 in one and 0.0 in the other"),
])
def test_runs_that_differ_in_more_than_the_schedule_are_refused_with_one_line(tmp_path, change, message):
    first, second = configs(LRS[:2])
    second = load_config(None, [*TINY, "optimizer.lr=3e-3", *change])
    with pytest.raises(ValueError) as error:
        train_together([first, second], [tmp_path / "lr0", tmp_path / "lr1"])
    assert message in str(error.value) and "\n" not in str(error.value)
    assert "(only the learning-rate schedule and train.seed may differ)" in str(error.value)
    assert not (tmp_path / "lr0").exists() and not (tmp_path / "lr1").exists()  # refused before any write
    assert together_conflict([first]) == "training together needs two runs or more, got 1"
    assert together_groups({"a": first, "b": second, "c": configs(LRS)[2]}) == [("a", "c"), ("b",)]


def test_the_matmul_choice_of_runs_trained_together(tmp_path, monkeypatch):
    """oneDNN asked for: vmapped runs multiply with XLA (a vmapped oneDNN call takes the runs one after another, its
    weights mapped, which no matmul choice timed), `lax.map`ped ones with oneDNN, once per run as a lone run does.
    ``auto``: the first run measures, the others read its answer, and the shared time counts both."""
    extra = ["train.tokens=1024"]  # 4 steps
    for stacked, impl, reason in (("vmap", "xla", "runs trained together by vmap"), ("map", "onednn", "")):
        records = train_together(configs(LRS[:2], [*extra, "kernel.matmul_impl=onednn"]),
                                 [tmp_path / stacked / f"lr{i}" for i in range(2)], stacked=stacked)
        choices = [record["matmul_choice"] for record in records]
        assert [(choice["matmul_impl"], choice["reason"]) for choice in choices] == [(impl, reason)] * 2
    monkeypatch.setattr(kernel_choice, "KERNEL_FILE", tmp_path / "kernel.json")
    records = train_together(configs(LRS[:2], [*extra, "kernel.matmul_impl=auto"]),
                             [tmp_path / "auto" / f"lr{i}" for i in range(2)], stacked="map")
    assert [record["matmul_choice"]["source"] for record in records] == ["measured", "cache"]
    seconds = sum(record[key]["seconds"] for record in records for key in ("matmul_choice", "kernel_choice"))
    assert records[0]["time"]["kernel_choice_s"] == records[1]["time"]["kernel_choice_s"] == pytest.approx(seconds)
    assert records[0]["matmul_choice"]["seconds"] > 0


TWO_PROCESSES = """
import sys
from jaxformer.parallel.config import DistributedConfig
from jaxformer.parallel.distributed import initialize
initialize(DistributedConfig(coordinator_address=sys.argv[2], num_processes=2, process_id=int(sys.argv[1])), {})
from jaxformer.train.config import load_config
from jaxformer.train.together import together_conflict
print(together_conflict([load_config(None, [f"optimizer.lr={lr}"]) for lr in (1e-3, 3e-3)]))
"""


def test_runs_of_a_job_of_two_processes_are_refused_training_together(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    lines = last_lines([[sys.executable, "-c", TWO_PROCESSES, str(i), address] for i in range(2)], env, timeout=120)
    assert lines == ["runs train together in one process only, not across 2 processes"] * 2


def test_a_step_that_only_saves_writes_no_row(tmp_path):
    """Rows are written at log and eval steps (every 4th and the last here); a checkpoint at step 3 or 6 wrote a
    row of tokens and wall time alone, in a lone run and in runs trained together."""
    extra = ["train.tokens=2048", "checkpoint.interval=3", "checkpoint.max_overhead=1e9"]  # 8 steps, saves at 3, 6, 8
    train(configs(LRS[:1], extra)[0], tmp_path / "alone")
    run_dirs = [tmp_path / f"together{i}" for i in range(2)]
    train_together(configs(LRS[:2], extra), run_dirs)
    for run_dir in (tmp_path / "alone", *run_dirs):
        assert [row["step"] for row in rows(run_dir)] == [4, 8]
        assert all("train_loss" in row for row in rows(run_dir))
        assert (run_dir / "checkpoints" / "6").is_dir()  # the saves were made
