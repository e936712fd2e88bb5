"""Ctrl-C in a `jaxformer` command: a save Orbax begins ends whole before the interrupt is raised, an interrupt
that lands in JAX's garbage-collection callback is raised again rather than printed and lost, and a sweep's
workers stop with their launcher, none replaced; a sweep's closing fit leaves fit/ whole or as it was."""

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from jaxformer.train.checkpoint import Checkpointer
from jaxformer.train.interrupts import deferred_interrupt, raise_swallowed_interrupts

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """SIGINT as a terminal's Python process has it (KeyboardInterrupt): pytest-xdist's workers ignore it, and an
    ignored signal stays ignored in the processes they start (a handled one is the default again after exec)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_as_orbax_begins_an_asynchronous_save_lets_the_save_end_whole_then_interrupts(tmp_path):
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=2, asynchronous=True)
    begin = checkpointer.manager.save

    def interrupted_save(*args, **kwargs):  # Ctrl-C arrives inside Orbax's save (its threads starting)
        signal.raise_signal(signal.SIGINT)
        return begin(*args, **kwargs)

    checkpointer.manager.save = interrupted_save
    with pytest.raises(KeyboardInterrupt):
        checkpointer.save(1, {"params": {"w": jnp.ones((3, 2), jnp.float32)}}, {})
    checkpointer.close()
    assert checkpointer.steps() == [1]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["1"]  # no `1.orbax-checkpoint-tmp`


def test_a_second_ctrl_c_is_not_held_back():
    with pytest.raises(KeyboardInterrupt), deferred_interrupt():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        pytest.fail("the second Ctrl-C was held back")


def test_ctrl_c_in_a_garbage_collection_callback_is_raised_again(monkeypatch):
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    raise_swallowed_interrupts()

    def callback(phase, info):  # as JAX's `_xla_gc_callback` running when SIGINT's handler ran
        raise KeyboardInterrupt

    gc.callbacks.append(callback)
    try:
        with pytest.raises(KeyboardInterrupt):
            gc.collect()
            gc.callbacks.remove(callback)
            time.sleep(5)  # the signal's handler runs at the next instructions
    finally:
        if callback in gc.callbacks:
            gc.callbacks.remove(callback)


def _session(sid: int) -> list[int]:
    """The processes of session ``sid`` (a Ray actor leads a process group of its own within it)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while read
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


@pytest.mark.parametrize(("executor", "to_group"), [("local", True), ("local", False), ("ray", True)],
                         ids=["terminal", "launcher-alone", "ray-terminal"])
def test_ctrl_c_stops_a_sweep_and_its_workers_at_once_none_replaced(tmp_path, executor, to_group):
    spec = yaml.safe_load((ROOT / "sweeps" / "tiny.yaml").read_text())
    spec["isoflop"] = {**spec["isoflop"], "budgets": [1e11], "params": [8e3]}  # one run of about half a minute
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    sweep = subprocess.Popen([sys.executable, "-m", "jaxformer.cli", "sweep", str(tmp_path / "spec.yaml"), "--out",
                              str(out), "--workers", "1", "--executor", executor], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)  # as a terminal's job
    deadline = time.time() + 120
    while not any(p.name.isdigit() for p in out.glob("runs/*/checkpoints/*")) and time.time() < deadline:
        time.sleep(0.05)
    # the terminal's Ctrl-C reaches the launcher and its worker; `kill -INT PID` the launcher alone
    (os.killpg if to_group else os.kill)(sweep.pid, signal.SIGINT)
    started = time.time()
    _, err = sweep.communicate(timeout=60)
    if executor == "ray":  # Ray's own notes come first (a local instance started, its token)
        assert "Traceback" not in err
        err = err.splitlines(keepends=True)[-1]
    assert (sweep.returncode, err) == (130, "jaxformer sweep: interrupted\n")
    assert time.time() - started < 5  # no worker started again to resume the run, nor waited for
    time.sleep(0.5)
    assert _session(sweep.pid) == []  # no process of the sweep's is left: workers, Ray's actors and its servers
    assert not list(out.glob("runs/*/final.json")) and not list(out.glob("runs/*/checkpoints/*tmp*"))


def test_a_worker_that_does_not_end_on_ctrl_c_is_killed_and_not_replaced(tmp_path, monkeypatch, capsys):
    """A worker once hung in ``malloc`` after its SIGINT (its heap corrupt) and the launcher waited on it for ever.
    Two stand-in worker processes, a run requested from each: one ends on SIGINT, one ignores it; after Ctrl-C the
    second is killed once the grace has passed, and neither is replaced (each supervisor's request stops)."""
    import threading

    from jaxformer.sweep import executors

    monkeypatch.setattr(executors, "STOP_GRACE_S", 1.0)
    pool = executors.LocalPool(2, 1, tmp_path)
    stand_ins = [subprocess.Popen(  # reads the request, then trains for ever
        [sys.executable, "-c", f"import signal, sys, time; signal.signal(signal.SIGINT, {handler}); "
                               "sys.stdin.readline(); time.sleep(600)"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True) for handler in ("signal.default_int_handler", "signal.SIG_IGN")]
    for worker, process in zip(pool.workers, stand_ins):
        worker.process = process
    raised = []

    def request(worker):
        try:
            worker.train(tmp_path, "run")
        except KeyboardInterrupt:
            raised.append(worker)

    supervisors = [threading.Thread(target=request, args=(worker,)) for worker in pool.workers]
    for supervisor in supervisors:
        supervisor.start()
    time.sleep(1.0)  # both requests read
    started = time.monotonic()
    pool.interrupt()  # SIGINT after a second to both; the one that ignores it killed a second later
    for supervisor in supervisors:
        supervisor.join(timeout=10)
    assert 1.5 < time.monotonic() - started < 5
    assert [process.wait(timeout=1) for process in stand_ins] == [-signal.SIGINT, -signal.SIGKILL]
    assert sorted(map(id, raised)) == sorted(map(id, pool.workers)) and [w.started for w in pool.workers] == [0, 0]
    assert capsys.readouterr().err == (f"worker process {stand_ins[1].pid} did not end on its SIGINT: killed (its run "
                                       "resumes from its last checkpoint at a relaunch)\n")


def test_a_worker_ended_by_sigint_alone_stops_its_request_and_is_not_replaced(tmp_path):
    """The terminal's Ctrl-C can end a worker before its launcher's supervisor hears of it: the request stops
    (KeyboardInterrupt) and no fresh worker is started to resume the run. A stand-in worker process reads the
    request and is ended by SIGINT."""
    from jaxformer.sweep.worker import WarmWorker

    worker = WarmWorker(dict(os.environ), tmp_path / "worker.log")
    worker.process = subprocess.Popen(
        [sys.executable, "-c", "import os, signal, sys; sys.stdin.readline(); os.kill(os.getpid(), signal.SIGINT)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    stand_in = worker.process
    with pytest.raises(KeyboardInterrupt):
        worker.train(tmp_path, "run")
    assert stand_in.returncode == -signal.SIGINT and worker.started == 0 and worker.process is None


def test_ctrl_c_in_a_command_that_exits_at_once_skips_the_teardown_too(monkeypatch, capsys):
    """A sweep interrupted in its closing fit crashed in JAX's teardown (SIGSEGV after the one line)."""
    import jaxformer.cli as cli
    from jaxformer.commands import fit

    def interrupted(args):
        raise KeyboardInterrupt

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setenv("JAXFORMER_TUNE", "0")  # no re-execution
    monkeypatch.setattr(sys, "argv", ["jaxformer", "fit", "runs.csv"])
    monkeypatch.setattr(fit, "run", interrupted)
    monkeypatch.setattr(cli, "_exit_at_once", exit_now)  # os._exit, the streams flushed
    with pytest.raises(SystemExit) as ended:
        cli.main()
    assert ended.value.code == 130 and capsys.readouterr().err == "jaxformer fit: interrupted\n"


@pytest.fixture
def fitted_sweep(tmp_path):
    """A sweep directory of a synthetic IsoFLOP sweep (Chinchilla's law) and the results rows its launch hands the
    closing fit (`fit_sweep`)."""
    from jaxformer.scaling.allocation import PRESETS
    from jaxformer.scaling.synthetic import isoflop_sweep
    from jaxformer.sweep.table import write_sweep

    table = isoflop_sweep(PRESETS["chinchilla"], np.logspace(18, 20, 3), sizes=5)
    rows = [{"status": "done", "flops_rule": "exact", "N": n, "D": d, "loss": loss}
            for n, d, loss in zip(table.N, table.D, table.loss)]
    return write_sweep(table, tmp_path / "sweep"), rows


def test_ctrl_c_as_a_sweeps_closing_fit_draws_its_figures_leaves_no_fit_directory(fitted_sweep, monkeypatch):
    """`jaxformer sweep` interrupted while its fit drew the figures (6 s into a relaunch that only fits) left an empty
    fit/ in --out: the directory was made before the figures were drawn."""
    from matplotlib.figure import Figure

    from jaxformer.sweep.fit import fit_sweep
    from jaxformer.sweep.spec import FitSpec

    out, rows = fitted_sweep
    draw = Figure.savefig

    def interrupted_draw(figure, *args, **kwargs):  # Ctrl-C arrives as a figure is drawn
        signal.raise_signal(signal.SIGINT)
        return draw(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", interrupted_draw)
    with pytest.raises(KeyboardInterrupt):
        fit_sweep(out, rows, FitSpec(approaches=[3], bootstrap=0))
    assert not (out / "fit").exists()


def test_ctrl_c_as_a_sweeps_closing_fit_is_written_waits_for_the_whole_fit(fitted_sweep, monkeypatch):
    """A Ctrl-C once the fit is drawn waits for its files: fit.json and its six figures, then the interrupt."""
    from jaxformer.files import write_all_atomic
    from jaxformer.sweep import fit
    from jaxformer.sweep.spec import FitSpec

    out, rows = fitted_sweep

    def interrupted_write(payloads):  # Ctrl-C arrives as the files are written
        signal.raise_signal(signal.SIGINT)
        write_all_atomic(payloads)

    monkeypatch.setattr(fit, "write_all_atomic", interrupted_write)
    with pytest.raises(KeyboardInterrupt):
        fit.fit_sweep(out, rows, FitSpec(approaches=[3], bootstrap=0))
    written = sorted(path.name for path in (out / "fit").iterdir())
    assert written == ["contour.png", "contour.svg", "fit.json", "n_opt.png", "n_opt.svg", "residuals.png",
                       "residuals.svg"]
    assert json.loads((out / "fit" / "fit.json").read_text())["approach3"]["params"]["alpha"] > 0
