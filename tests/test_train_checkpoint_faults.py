"""What a run directory's checkpoints can meet besides a clean resume: a finished run without them, a disk that
fills while saving, checkpoints of another model (bad input, kept) or unreadable ones (set aside), foreign entries,
Ctrl-C, a path the user may not write."""

import errno
import gc
import hashlib
import json
import logging
import resource
import shutil
import signal
import sys
from pathlib import Path

import pytest

from jaxformer.cli import main
from jaxformer.train.attempt import attempt_run
from jaxformer.train.checkpoint_config import latest_saved_step

# 4 steps of 1024 tokens, a checkpoint every 2; one shape for every run here, so the step compiles once
TINY = ["model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.max_seq_len=64",
        "data.corpus=synthetic-markov", "data.markov.order=1", "data.markov.alphabet=32",
        "data.markov.bytes=100000", "optimizer.lr=1e-2", "train.batch_size=16", "train.seq_len=64",
        "train.tokens=4096", "train.eval_tokens=2048", "checkpoint.interval=2", "logging.interval=2",
        "logging.progress=none", "logging.tensorboard=false", "train.compilation_cache=",
        "kernel.attention_impl=xla", "kernel.matmul_impl=xla"]


@pytest.fixture(scope="module")
def config_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("config") / "run.yaml"
    path.write_text("{}\n")
    return str(path)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, config_path) -> Path:
    """A finished run of `TINY`, checkpoints at steps 2 and 4; tests copy it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", config_path, *TINY, "--run-dir", str(run_dir)]) == 0
    return run_dir


def md5s(run_dir: Path, names=("final.json", "metrics.jsonl", "config.yaml")) -> dict[str, str]:
    return {name: hashlib.md5((run_dir / name).read_bytes()).hexdigest() for name in names}


def test_a_finished_run_without_checkpoints_is_kept_and_refuses_another_config(tmp_path, finished, config_path,
                                                                               capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    shutil.rmtree(run_dir / "checkpoints")
    before = md5s(run_dir)
    capsys.readouterr()
    assert main(["train", config_path, *TINY, "train.tokens=2048", "optimizer.lr=3e-3", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"jaxformer train: error: cannot resume {run_dir}: optimizer.lr was 0.01 in the saved run, "
                   "now 0.003 (use a new train.run_dir)")
    assert md5s(run_dir) == before and not (run_dir / "error.json").exists()
    assert main(["train", config_path, *TINY, "checkpoint.resume=false", "--run-dir", str(run_dir)]) == 2
    assert f"checkpoint.resume=false but {run_dir} holds a finished run" in capsys.readouterr().err
    assert main(["train", config_path, *TINY, "--run-dir", str(run_dir)]) == 0  # the same run: its record, as it is
    assert md5s(run_dir) == before and not (run_dir / "checkpoints").exists()

    (run_dir / "final.json").unlink()  # a run that stopped before its first checkpoint starts again, as it likes
    assert main(["train", config_path, *TINY, "optimizer.lr=3e-3", "--run-dir", str(run_dir)]) == 0
    assert json.loads((run_dir / "final.json").read_text())["config"]["optimizer"]["lr"] == 3e-3


def test_a_disk_that_fills_while_saving_fails_the_run_in_one_line_with_an_error_record(tmp_path, config_path,
                                                                                       capsys, caplog):
    """Files past 40 kB cannot be written (RLIMIT_FSIZE: EFBIG, as ENOSPC a failure Orbax reports through
    TensorStore as a ValueError): the run's small files are written, its first checkpoint is not."""
    run_dir = tmp_path / "run"
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, limits[1]))
    try:
        code = main(["train", config_path, *TINY, "checkpoint.asynchronous=true", "--run-dir", str(run_dir)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"jaxformer train: error: [Errno {errno.EFBIG}] cannot save checkpoint step 2 in "
                          f"{run_dir.absolute() / 'checkpoints'}: File too large"), err
    error = json.loads((run_dir / "error.json").read_text())
    assert error["error"] == "RunWriteError" and "cannot save checkpoint step 2" in error["message"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []  # no Orbax tracebacks
    assert latest_saved_step(run_dir) is None


def test_a_write_failure_tensorstore_reports_maps_to_its_errno():
    from jaxformer.train.late_reports import failed_write_errno

    full = ("RESOURCE_EXHAUSTED: Error writing local file \"/m/checkpoints/40.orbax-checkpoint-tmp/state/_sharding\": "
            "Failed to write 15139 bytes to file 19: No space left on device [os_error_code='28']")
    assert failed_write_errno(ValueError(full)) == errno.ENOSPC
    assert failed_write_errno(ValueError("RESOURCE_EXHAUSTED: out of quota")) == errno.ENOSPC
    assert failed_write_errno(OSError(errno.EROFS, "Read-only file system")) == errno.EROFS
    assert failed_write_errno(ValueError("Requested shape: (64,) is not compatible with the stored shape: (32,)")) is None


def tree_md5s(root: Path) -> dict[str, str]:
    """Every file under ``root`` by its relative path, with its MD5."""
    return {str(path.relative_to(root)): hashlib.md5(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.mark.parametrize(("change", "line"), [
    (["model.d_model=64", "model.num_heads=4"],
     "params.decoder.blocks.0.attention.wk.value is (32, 2, 16) float32 there, (64, 4, 16) float32 in the config's "
     "model (and 32 other arrays)"),
    (["model.num_layers=2"],
     "params.decoder.blocks.1.attention.wk.value is absent there, (32, 2, 16) float32 in the config's model "
     "(and 26 other arrays)"),
])
def test_checkpoints_of_another_model_are_bad_input_in_one_line_and_kept(tmp_path, finished, config_path, capsys,
                                                                         monkeypatch, change, line):
    """A run directory holding the checkpoints of another shape (its config.yaml gone, so no resume check names the
    field): exit 2 naming the first array that differs, both shapes; no file moved, changed or added."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished / "checkpoints", run_dir / "checkpoints")
    before = tree_md5s(run_dir)
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    capsys.readouterr()
    code = main(["train", config_path, *TINY, *change, "--run-dir", str(run_dir)])
    gc.collect()
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == (f"jaxformer train: error: checkpoint step 4 in {run_dir / 'checkpoints'} holds "
                                 f"another model: {line}; train it with the config that saved it, or use a new "
                                 "train.run_dir")
    assert tree_md5s(run_dir) == before and not (tmp_path / "run" / "corrupt_checkpoints").exists()
    assert [repr(r.object) for r in reported] == []
    assert main(["train", config_path, *TINY, "--run-dir", str(run_dir)]) == 0  # its own config resumes it
    assert json.loads((run_dir / "final.json").read_text())["resumed_from"]["step"] == 4


def test_a_resume_reads_each_steps_metadata_once(tmp_path, finished, config_path, monkeypatch):
    """The model check runs before anything is written (`prepare_run`); restoring does not read it all again."""
    from jaxformer.train import checkpoint_shapes

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    (run_dir / "final.json").unlink()
    read, difference = [], checkpoint_shapes._model_difference
    monkeypatch.setattr(checkpoint_shapes, "_model_difference",
                        lambda step_dir, *args: read.append(int(step_dir.name)) or difference(step_dir, *args))
    assert main(["train", config_path, *TINY, "--run-dir", str(run_dir)]) == 0
    assert read == [4, 2]
    assert json.loads((run_dir / "final.json").read_text())["resumed_from"]["step"] == 4


def test_a_step_whose_metadata_does_not_read_is_corrupt_and_falls_back(tmp_path, finished, config_path, capsys):
    """Not another model: unreadable metadata keeps the corrupt-checkpoint policy (set aside, the previous step)."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    (run_dir / "final.json").unlink()
    (run_dir / "checkpoints" / "4" / "state" / "_METADATA").write_text("garbage")
    capsys.readouterr()
    assert main(["train", config_path, *TINY, "--run-dir", str(run_dir)]) == 0
    assert "warning: checkpoint step 4 is unreadable (JSONDecodeError" in capsys.readouterr().err
    assert json.loads((run_dir / "final.json").read_text())["resumed_from"]["step"] == 2
    assert (run_dir / "corrupt_checkpoints" / "4" / "state" / "_METADATA").read_text() == "garbage"
    assert latest_saved_step(run_dir) == 4  # saved again as the run ended


def test_a_step_whose_arrays_do_not_match_their_digest_is_set_aside_and_the_run_retrains_to_the_same_state(
        tmp_path, finished, config_path, capsys):
    """A step that reads but whose arrays are not those saved (here its saved digest of them changed, as if the
    arrays had): set aside, the previous step resumed, and retrained from it the run ends on the same arrays."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    (run_dir / "final.json").unlink()
    meta_path = run_dir / "checkpoints" / "4" / "meta" / "metadata"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "digest": "0" * 64}))
    capsys.readouterr()
    assert main(["train", config_path, *TINY, "--run-dir", str(run_dir)]) == 0
    assert ("warning: checkpoint step 4 is unreadable (ValueError: array contents do not match the digest saved "
            "with them)") in capsys.readouterr().err
    assert json.loads((run_dir / "final.json").read_text())["resumed_from"]["step"] == 2
    assert json.loads(meta_path.read_text())["digest"] == meta["digest"]  # step 4 trained again, bit for bit
    assert (run_dir / "corrupt_checkpoints" / "4" / "meta" / "metadata").is_file()


def test_train_called_as_a_library_gives_its_caller_back_their_hooks(tmp_path, finished, monkeypatch):
    """`train` called from Python, not through the `jaxformer` command, left sys.unraisablehook replaced and a filter
    on asyncio's logger for the rest of the process (`Checkpointer.restore_latest` installed them for good, to drop
    the late reports of a failed restore), and a filter on absl's logger (every writing `Checkpointer` added it for
    good, to drop Orbax's tracebacks of a failed write): the caller's hook and filters are theirs again when it
    returns."""
    from jaxformer.train.config import load_config
    from jaxformer.train.loop import train

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    (run_dir / "final.json").unlink()
    (run_dir / "checkpoints" / "4" / "state" / "_METADATA").write_text("garbage")  # a failed restore, then step 2
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    def callers_filter(record: logging.LogRecord) -> bool:
        return True

    absl_filters = [callers_filter]  # the caller's own, none of jaxformer's (`finished` ran the command)
    monkeypatch.setattr(logging.getLogger("absl"), "filters", list(absl_filters))
    mine, filters = sys.unraisablehook, list(logging.getLogger("asyncio").filters)
    record = train(load_config(None, TINY), run_dir)
    gc.collect()
    assert record["resumed_from"]["step"] == 2
    assert sys.unraisablehook is mine and logging.getLogger("asyncio").filters == filters
    assert logging.getLogger("absl").filters == absl_filters
    assert [repr(r.exc_value) for r in reported] == []


def test_a_checkpointer_that_writes_gives_absl_its_filters_back(tmp_path, monkeypatch):
    """A writing `Checkpointer` added its filter of Orbax's write tracebacks to absl's logger for good: now only
    while it saves, waits or closes."""
    import jax.numpy as jnp

    from jaxformer.train.checkpoint import Checkpointer

    monkeypatch.setattr(logging.getLogger("absl"), "filters", [])
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=2, asynchronous=True)
    checkpointer.save(1, {"params": {"w": jnp.ones((3, 2), jnp.float32)}}, {})
    assert logging.getLogger("absl").filters == []
    checkpointer.close()
    assert logging.getLogger("absl").filters == [] and checkpointer.steps() == [1]


def test_restoring_another_models_checkpoints_raises_and_moves_nothing(tmp_path):
    """`Checkpointer.restore_latest` itself, for every caller (training, a read-only restore): the newest step read
    is another model's, refused before any step is restored or set aside."""
    import jax
    import jax.numpy as jnp

    from jaxformer.train.checkpoint import Checkpointer
    from jaxformer.train.checkpoint_shapes import CheckpointMismatch

    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=2)
    for step in (1, 2):
        checkpointer.save(step, {"params": {"w": jnp.full((3, 2), step, jnp.float32)}}, {})
        assert checkpointer.saving is None and checkpointer.steps()[-1] == step  # synchronous by default: written
    checkpointer.close()
    before = tree_md5s(tmp_path)
    for read_only in (False, True):
        checkpointer = Checkpointer(tmp_path / "checkpoints", keep=2, read_only=read_only)
        try:
            with pytest.raises(CheckpointMismatch) as error:
                checkpointer.restore_latest({"params": {"w": jax.ShapeDtypeStruct((3, 4), jnp.float32)}})
            with pytest.raises(CheckpointMismatch, match=r"params\.v is absent there, \(3, 2\) float32 in the config"):
                checkpointer.restore_latest({"params": {"v": jax.ShapeDtypeStruct((3, 2), jnp.float32),
                                                        "w": jax.ShapeDtypeStruct((3, 2), jnp.float32)}})
            step, state, _ = checkpointer.restore_latest({"params": {"w": jax.ShapeDtypeStruct((3, 2), jnp.float32)}})
        finally:
            checkpointer.close()
        assert str(error.value) == (f"checkpoint step 2 in {tmp_path / 'checkpoints'} holds another model: params.w is "
                                    "(3, 2) float32 there, (3, 4) float32 in the config's model; train it with the "
                                    "config that saved it, or use a new train.run_dir")
        assert (step, float(state["params"]["w"][0, 0])) == (2, 2.0)
        assert tree_md5s(tmp_path) == before


async def _read_array_index_and_device_put():  # named as Orbax's read of one array
    return None


def test_only_the_late_reports_of_a_failed_restore_are_dropped():
    from jaxformer.train.late_reports import _unraisable_read_after_its_loop

    read = _read_array_index_and_device_put()
    try:
        late = type("Unraisable", (), {"object": read, "exc_value": Exception("Encountered error while reading")})
        assert _unraisable_read_after_its_loop(late)
        other = type("Unraisable", (), {"object": test_only_the_late_reports_of_a_failed_restore_are_dropped,
                                        "exc_value": Exception("Encountered error while reading")})
        assert not _unraisable_read_after_its_loop(other)
    finally:
        read.close()


def test_ctrl_c_and_failed_writes_leave_no_orbax_traceback_and_other_errors_do():
    from jaxformer.train.late_reports import _keeps_absl_record

    import orbax.checkpoint

    orbax_file = orbax.checkpoint.checkpoint_manager.__file__

    def record(error: BaseException, pathname: str = orbax_file) -> logging.LogRecord:
        return logging.LogRecord("absl", logging.ERROR, pathname, 1, "failed", (), (type(error), error, None))

    assert not _keeps_absl_record(record(KeyboardInterrupt()))
    assert not _keeps_absl_record(record(ValueError("RESOURCE_EXHAUSTED: [os_error_code='28']")))
    assert _keeps_absl_record(record(RuntimeError("a bug")))
    assert _keeps_absl_record(logging.LogRecord("absl", logging.ERROR, orbax_file, 1, "plain", (), None))
    assert _keeps_absl_record(record(PermissionError(13, "Permission denied"), pathname=__file__))  # not Orbax's


def test_a_foreign_entry_named_by_a_non_ascii_digit_is_no_step(tmp_path):
    for name in ("²", "7", "3", "x", "12.orbax-checkpoint-tmp"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert latest_saved_step(tmp_path) == 7


@pytest.mark.parametrize(("code", "status", "exit_code"), [(errno.EROFS, "bad_input", 2), (errno.ENOSPC, "failed", 1)])
def test_an_os_error_is_bad_input_where_the_command_says_so(tmp_path, config_path, monkeypatch, capsys, code, status,
                                                            exit_code):
    """A read-only run directory is the user's input (exit 2, as `jaxformer.cli` classes it); a full disk is not."""
    def train(config, run_dir):
        raise OSError(code, "cannot write", str(run_dir / "config.yaml"))

    monkeypatch.setattr("jaxformer.train.attempt.train", train)
    assert attempt_run(config_path, TINY, tmp_path / "a").status == status
    assert main(["train", config_path, *TINY, "--run-dir", str(tmp_path / "b")]) == exit_code
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_path_refused_once_the_run_is_written_fails_the_run_with_an_error_record(tmp_path, config_path,
                                                                                   monkeypatch, capsys):
    """EACCES from a checkpoint or cache file midway (a disk remounted read-only, say) is the machine's: exit 1 and
    ``error.json``, though the same errno on the run directory before anything is written is bad input."""
    def run(self):
        raise PermissionError(errno.EACCES, "Permission denied", str(self.run_dir / "checkpoints" / "4"))

    monkeypatch.setattr("jaxformer.train.loop.RunSegment.run", run)
    run_dir = tmp_path / "run"
    attempt = attempt_run(config_path, TINY, run_dir)
    assert attempt.status == "failed" and attempt.error.errno == errno.EACCES
    assert (run_dir / "config.yaml").is_file()  # written before it failed
    assert json.loads((run_dir / "error.json").read_text())["error"] == "RunWriteError"
    capsys.readouterr()
    assert main(["train", config_path, *TINY, "--run-dir", str(tmp_path / "cli")]) == 1
    assert capsys.readouterr().err.strip() == (f"jaxformer train: error: [Errno 13] Permission denied: "
                                               f"'{tmp_path / 'cli' / 'checkpoints' / '4'}'")


def test_a_killed_saves_temporary_directory_is_removed_by_training_and_left_by_a_reader(tmp_path):
    """Orbax writes a step under a temporary name and renames it when whole: a process killed mid-save leaves that
    directory. A read-only checkpointer (generation, export) leaves it as it is; the next training run removes it
    (Orbax does so in the background, awaited before that run's first save)."""
    import jax.numpy as jnp

    from jaxformer.train.checkpoint import Checkpointer

    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=2)
    checkpointer.save(1, {"params": {"w": jnp.ones((3, 2), jnp.float32)}}, {})
    checkpointer.close()
    partial = tmp_path / "checkpoints" / "2.orbax-checkpoint-tmp-1765000000000000"  # Orbax's name for step 2's write
    partial.mkdir()
    (partial / "state").write_bytes(b"half")
    Checkpointer(tmp_path / "checkpoints", keep=2, read_only=True).close()
    assert (partial / "state").read_bytes() == b"half"
    training = Checkpointer(tmp_path / "checkpoints", keep=2)
    training.save(3, {"params": {"w": jnp.ones((3, 2), jnp.float32)}}, {})
    training.close()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1", "3"]
