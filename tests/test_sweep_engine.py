"""The sweep engine: warm workers reuse compiled programs, the data and the peak; a dead worker is replaced."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

from jaxformer.benchmarks.train import bench_config
from jaxformer.parallel import Layout
from jaxformer.sweep import worker as worker_module
from jaxformer.sweep.launch import lone_threads
from jaxformer.sweep.runs import RunPaths
from jaxformer.train import compiled
from jaxformer.train.attempt import attempt_run
from jaxformer.train.checkpoint import Checkpointer
from jaxformer.train.config import load_config
from jaxformer.train.loop import train
from jaxformer.train.optimizer import make_optimizer
from jaxformer.train.peak import machine_key, machine_peak_flops
from jaxformer.train.step import build_state

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.max_seq_len=64",
        "data.corpus=synthetic-markov", "data.markov.bytes=200000", "train.batch_size=8", "train.seq_len=32",
        "train.tokens=8192", "train.eval_tokens=2048", "checkpoint.interval=10", "logging.progress=none",
        "logging.tensorboard=false", "train.compilation_cache=", "train.peak_flops=1e10"]


def test_a_process_compiles_a_shape_once_for_every_run_of_it(tmp_path):
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration"
        else None)
    # a corpus and a model shape no other test builds, whichever tests ran before in this process (both caches are
    # per process)
    data = ["data.markov.seed=4242", "model.d_model=24"]
    first = train(load_config(None, [*TINY, *data]), tmp_path / "a")
    before = len(compiles)
    second = train(load_config(None, [*TINY, *data, "train.seed=1", "optimizer.lr=1e-3"]), tmp_path / "b")
    assert len(compiles) == before  # the second run of the shape compiled nothing
    assert second["compiled"] == "reused in this process" and first["compiled"] != second["compiled"]
    assert second["time"]["data_s"] < first["time"]["data_s"] and second["time"]["startup_s"] == 0.0
    assert all(run["time"]["init_s"] >= 0 and run["time"]["restore_s"] >= 0 for run in (first, second))
    assert second["val_loss"] != first["val_loss"]  # another seed and learning rate: another run
    times = second["time"]
    parts = sum(v for k, v in times.items() if k not in ("total_s", "startup_s"))
    assert parts == pytest.approx(times["total_s"], rel=1e-9) and times["train_s"] > 0


def test_a_run_that_restores_a_checkpoint_never_builds_an_initial_state(tmp_path, monkeypatch):
    """A sweep's cooldown branch (or any resumed run) restores into the abstract state: the initial-state program
    is neither compiled nor run, and the run continues from the checkpoint as before."""

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration"
        else None)
    shape = ["data.markov.seed=4343", "model.d_model=20"]  # a shape no other test builds
    trunk = train(load_config(None, [*TINY, *shape]), tmp_path / "trunk")
    branch = tmp_path / "branch"
    (branch / "checkpoints").mkdir(parents=True)
    last = max(int(step.name) for step in (tmp_path / "trunk" / "checkpoints").iterdir() if step.name.isdigit())
    shutil.copytree(tmp_path / "trunk" / "checkpoints" / str(last), branch / "checkpoints" / str(last))
    monkeypatch.setattr(compiled, "_INITS", {})  # forget the init program: building a state would compile it anew
    before = len(compiles)
    longer = train(load_config(None, [*TINY, *shape, "train.tokens=10240"]), branch)
    assert len(compiles) == before  # nothing compiled: the train and eval steps are reused, and no init program
    assert longer["resumed_from"]["step"] == trunk["steps"] and longer["steps"] > trunk["steps"]
    assert longer["val_loss"] != trunk["val_loss"]


@pytest.mark.parametrize("d_model, layers", [(16, 1), (48, 3)])
def test_the_initial_state_program_compiled_for_one_call_gives_the_default_programs_bits(d_model, layers):
    """`compiled.initial_state` compiles at `RUN_ONCE_OPTIMIZATION_LEVEL` (faster to compile); every parameter and
    optimizer leaf equals, bit for bit, the state of the same program at XLA's default level, so committed studies
    are still reproduced exactly."""
    config = bench_config(d_model, layers, 64, 16)
    optimizer = make_optimizer(config.optimizer)
    layout = Layout.for_run(config.parallel, config.model, config.micro_batch, jax.devices()[:1])
    _, _, init = compiled.initial_state(config.model, config.kernel, config.optimizer, optimizer, layout)
    default = jax.jit(lambda seed: build_state(config.model, seed, optimizer, config.kernel)[1])
    for seed in (0, 7):
        fast, plain = jax.tree.leaves(init(seed)), jax.tree.leaves(default(np.int32(seed)))
        assert len(fast) == len(plain) > 30
        for a, b in zip(fast, plain):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_the_matmul_peak_is_probed_once_per_machine_and_layout(tmp_path, monkeypatch):
    path = tmp_path / "peak.json"
    first = machine_peak_flops("float32", path)
    assert first > 1e8 and len(json.loads(path.read_text())) == 1

    def no_probe(*args, **kwargs):
        raise AssertionError("probed again")

    monkeypatch.setattr("jaxformer.train.peak.probe_matmul_peak", no_probe)
    assert machine_peak_flops("float32", path) == first


def test_a_peak_below_what_a_run_achieved_is_probed_again_once(tmp_path):
    """A peak probed on a busy machine (here 1 kFLOP/s) would put MFU over 100% for ever: a run that beats it has it
    probed again, once per process, and the larger kept."""
    path = tmp_path / "peak.json"
    path.write_text(json.dumps({machine_key("float32"): 1e3}))
    assert machine_peak_flops("float32", path, at_least=1e2) == 1e3  # beaten by nothing: kept
    probed = machine_peak_flops("float32", path, at_least=1e4)
    assert probed > 1e8 and json.loads(path.read_text()) == {machine_key("float32"): probed}
    assert machine_peak_flops("float32", path, at_least=probed * 1e3) == probed  # not again in this process


def test_the_matmul_probe_grows_until_a_product_outlasts_its_launch(monkeypatch):
    """On an accelerator a product of 1024 is over before its launch is (an H100's bf16 probe read 45 TFLOP/s, MFU
    106-273%): the probe doubles n until its best product takes ``min_seconds``. Here a CPU's 16x16 product stands in."""
    from jaxformer.train import peak

    timed, time_products = [], peak._best_product_seconds

    def spy(*args):
        timed.append(time_products(*args))
        return timed[-1]

    monkeypatch.setattr(peak, "_best_product_seconds", spy)
    grown = peak.probe_matmul_peak("float32", n=16, repeats=3, min_seconds=2e-3)
    sizes = [n for _, n in timed]
    assert sizes == [16 * 2**i for i in range(len(sizes))] and len(sizes) > 3
    assert timed[-1][0] >= 2e-3 or sizes[-1] == peak.MAX_PROBE_N
    assert all(best < 2e-3 for best, _ in timed[:-1])
    assert grown == 2.0 * sizes[-1] ** 3 / timed[-1][0]
    timed.clear()
    peak.probe_matmul_peak("float32", n=16, repeats=3)
    assert [n for _, n in timed] == [16]  # on the CPU n stays as asked by default


def _spec(tmp_path: Path) -> Path:
    spec = yaml.safe_load((ROOT / "sweeps" / "tiny.yaml").read_text())
    spec.update(name="engine", isoflop={"budgets": [3e9], "params": [8e3, 16e3]})
    spec["base"]["checkpoint"] = {"interval": 5}
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_replaced_and_its_run_resumes(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "jaxformer.cli", "sweep", str(_spec(tmp_path)), "--out", str(out), "--workers", "1"]
    sweep = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, victim = time.time() + 300, None
    while victim is None and time.time() < deadline:  # the first run's first checkpoint: kill its worker
        for run in (out / "runs").glob("*") if (out / "runs").is_dir() else []:
            if any(p.name.isdigit() for p in (run / "checkpoints").glob("*")) and not (run / "final.json").exists():
                victim = run.name
        time.sleep(0.05)
    assert victim is not None
    pid = int((out / "locks" / f"{victim}.lock").read_text())  # the worker holds the run's lock
    os.kill(pid, signal.SIGKILL)
    output, _ = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, output
    finals = {p.parent.name: json.loads(p.read_text()) for p in (out / "runs").glob("*/final.json")}
    assert len(finals) == 2
    assert finals[victim]["resumed_from"] is not None  # the new worker went on from the checkpoint
    log = (out / "logs" / f"{victim}.log").read_text()
    assert log.count("$ ") == 2 and f"(worker {pid})" in log
    other = next(name for name in finals if name != victim)
    assert (out / "logs" / f"{other}.log").read_text().count("$ ") == 1


def test_an_error_no_attempt_names_fails_its_run_and_the_worker_goes_on(tmp_path, monkeypatch, capfd):
    """A run that raises something other than bad input or a failed training (here a RuntimeError, as an
    accelerator's out-of-memory error is) fails alone, with that error as its reason and the traceback in its log;
    the warm process answers and trains the next run. Its output goes back where it went after each run."""
    sweep_dir = tmp_path / "sweep"
    (sweep_dir / "configs").mkdir(parents=True)
    (sweep_dir / "configs" / "good.yaml").write_text("{}\n")
    (sweep_dir / "configs" / "oom.yaml").write_text("{}\n")
    def attempt_together(config_paths, overrides, run_dirs):
        if Path(config_paths[0]).stem == "oom":
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory allocating 64 GiB")
        return [attempt_run(path, [*TINY, *overrides], run_dir) for path, run_dir in zip(config_paths, run_dirs)]

    monkeypatch.setattr("jaxformer.train.attempt.attempt_together", attempt_together)
    failed, = worker_module.train_group_here(sweep_dir, ["oom"])
    assert failed.status == "failed"
    assert failed.reason == "RuntimeError: RESOURCE_EXHAUSTED: out of memory allocating 64 GiB"
    assert json.loads((sweep_dir / "status" / "oom.json").read_text())["reason"] == failed.reason
    log = (sweep_dir / "logs" / "oom.log").read_text()
    assert "Traceback" in log and log.rstrip().endswith("RuntimeError: RESOURCE_EXHAUSTED: out of memory allocating 64 GiB")
    capfd.readouterr()
    os.write(1, b"between runs, on 1\n")  # file descriptors, as XLA's C++ logging writes
    os.write(2, b"between runs, on 2\n")
    assert capfd.readouterr() == ("between runs, on 1\n", "between runs, on 2\n")
    assert (sweep_dir / "logs" / "oom.log").read_text() == log
    started = time.perf_counter()
    done, = worker_module.train_group_here(sweep_dir, ["good"])
    elapsed = time.perf_counter() - started
    assert done.status == "done" and (sweep_dir / "runs" / "good" / "final.json").is_file()
    record = json.loads((sweep_dir / "status" / "good.json").read_text())  # the sweep's record of the attempt
    assert (record["status"], record["wall_s"], record["worker"]) == ("done", done.wall_s, os.getpid())
    assert 0 < done.wall_s <= elapsed


def _train_group_here(sweep_dir: Path, names: list[str]) -> list:
    """`train_group_here` with Python's output through file descriptors 1 and 2, as in a worker process (pytest's
    capture replaces it)."""
    with open(1, "w", closefd=False) as out, open(2, "w", closefd=False) as err, \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        return worker_module.train_group_here(sweep_dir, names)


def test_bad_configs_fail_their_runs_with_the_error_where_no_error_record_may_be_written(tmp_path):
    """Bad input never writes into a directory holding a run (`jaxformer.train.attempt.write_error`): the sweep's
    record still gives the error, not the log's last line. A group's output is in its first run's log, each error
    line naming its run; the others' logs say where it is."""
    sweep_dir, worker = tmp_path / "sweep", f"(worker {os.getpid()})"
    (sweep_dir / "configs").mkdir(parents=True)
    for name, setting in (("begun", "tokens: -5"), ("other", "seq_len: 0")):
        (sweep_dir / "configs" / f"{name}.yaml").write_text(f"train:\n  {setting}\n")
    (sweep_dir / "runs" / "begun").mkdir(parents=True)
    (sweep_dir / "runs" / "begun" / "config.yaml").write_text("{}\n")
    failed, = _train_group_here(sweep_dir, ["begun"])
    message = "train.tokens must be positive, got -5"
    reason = f"bad_input: {message}"
    assert (failed.status, failed.reason) == ("failed", reason)
    assert json.loads((sweep_dir / "status" / "begun.json").read_text())["reason"] == reason
    assert sorted(p.name for p in (sweep_dir / "runs" / "begun").iterdir()) == ["config.yaml"]
    command = (f"$ jaxformer train {sweep_dir / 'configs' / 'begun.yaml'} logging.progress=plain --run-dir "
               f"{sweep_dir / 'runs' / 'begun'}")
    log = sweep_dir / "logs" / "begun.log"
    assert log.read_text() == f"{command} {worker}\njaxformer train: error: {message}\n"

    log.unlink()
    outcomes = _train_group_here(sweep_dir, ["begun", "other"])
    other_message = "train.seq_len must be positive, got 0"
    assert [outcome.reason for outcome in outcomes] == [reason, f"bad_input: {other_message}"]
    assert log.read_text() == (f"{command} together with other {worker}\n"
                               f"jaxformer train: error: begun: {message}\n"
                               f"jaxformer train: error: other: {other_message}\n")
    other = (sweep_dir / "logs" / "other.log").read_text()
    assert other == f"$ trained together with begun {worker}: the output is in {log}\n"


def test_a_lone_run_gets_every_core_unless_it_resumes(tmp_path):
    """The last run left of a launch trains on all of the layout's cores when it starts afresh; one resuming from
    its checkpoints (a branch from its trunk's) keeps a worker's thread count, so that its resume is bit-exact."""
    assert lone_threads(tmp_path, ["fresh"], workers=2, threads=1) == 2
    assert lone_threads(tmp_path, ["fresh"], workers=3, threads=2) == 6
    checkpointer = Checkpointer(tmp_path / "runs" / "resuming" / "checkpoints", keep=1)
    checkpointer.save(20, {"w": np.zeros(3, np.float32)}, {"loader": {}})
    checkpointer.close()
    assert RunPaths(tmp_path, "resuming").state() == "partial"
    assert lone_threads(tmp_path, ["resuming"], workers=2, threads=1) == 1
    assert lone_threads(tmp_path, ["resuming"], workers=3, threads=2) == 2
    assert lone_threads(tmp_path, ["fresh", "resuming"], workers=2, threads=1) == 1  # a group with one resuming


def test_the_last_run_left_of_a_launch_trains_on_every_core_of_the_layout(tmp_path):
    """Two runs on a layout of two one-thread workers train a run each on one device; the one run a relaunch
    has left (started afresh) gets one worker of both threads, so two devices."""
    from sweep_helpers import jaxformer, variant

    spec, out = variant(tmp_path, "lone", isoflop={"budgets": [1e9], "params": [8e3, 16e3]}), tmp_path / "out"

    def meshes() -> dict[str, int]:
        return {path.parent.name: json.loads(path.read_text())["mesh"]["data"]
                for path in (out / "runs").glob("*/final.json")}

    def launch() -> None:
        result = jaxformer("sweep", spec, "--out", out, "--workers", 2, "--threads", 1)
        assert result.returncode == 0, result.stdout + result.stderr

    launch()
    assert meshes() == {"C1e09-N8240-s0": 1, "C1e09-N16496-s0": 1}
    shutil.rmtree(out / "runs" / "C1e09-N16496-s0")  # gone, not begun: the relaunch starts it afresh
    launch()
    assert meshes() == {"C1e09-N8240-s0": 1, "C1e09-N16496-s0": 2}


def test_a_run_whose_worker_dies_at_every_attempt_is_recorded_failed_after_two(tmp_path):
    """A worker process that cannot even start (its Python home missing) dies at each attempt: the run is given to a
    fresh one once, then recorded as failed with the exit status, not retried for ever."""
    worker = worker_module.WarmWorker({**os.environ, "PYTHONHOME": str(tmp_path / "missing")},
                                      tmp_path / "logs" / "worker-0.log")
    outcome = worker.train(tmp_path, "r1")
    assert worker.started == worker_module.ATTEMPTS == 2
    reason = "its worker died 2 times (exit status 1); last output: exit status 1"
    assert (outcome.status, outcome.reason) == ("failed", reason)
    record = json.loads((tmp_path / "status" / "r1.json").read_text())
    assert (record["status"], record["reason"], record["returncode"]) == ("failed", reason, 1)
    assert RunPaths(tmp_path, "r1").state() == "failed"
