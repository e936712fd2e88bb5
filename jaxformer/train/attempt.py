"""One training attempt on a run directory, as the `train` command and the sweep workers make it.

`attempt_run` loads the config, trains (or resumes), and turns the outcomes a user or a sweep
must tell apart into an `Attempt`: ``done``, ``bad_input`` (one line naming the field; exit 2
from the command) or ``failed`` (a non-finite loss or unreadable checkpoints; exit 1). A failed
attempt leaves ``RUN_DIR/error.json`` — except bad input aimed at a directory that already
holds a run (its config.yaml or checkpoints: a refused resume, another model's checkpoints), that
another process is training (`RunBusy`) or that holds the user's own files (`NotARunDirectory`), which writes
nothing there. An ``OSError`` before
the run directory is written is classed as the `jaxformer` command classes it
(`jaxformer.files.is_input_error`: a path that is wrong or not permitted, a read-only run directory, is bad input;
a disk that fills fails the attempt); once it is written (`jaxformer.train.loop.RunWriteError`), every ``OSError``
fails the attempt. `attempt_together` makes one attempt at several runs, trained together
(`jaxformer.train.together`) where they can.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Literal, Sequence

from jaxformer.files import is_input_error, write_json_atomic
from jaxformer.train.checkpoint import CheckpointError
from jaxformer.train.checkpoint_config import has_checkpoints
from jaxformer.train.config import load_config
from jaxformer.train.loop import NonFiniteLoss, RunWriteError, train
from jaxformer.train.prepare import NotARunDirectory
from jaxformer.train.run_claim import RunBusy


@dataclasses.dataclass(frozen=True)
class Attempt:
    """What one attempt came to: the ``final.json`` record, or the error and its kind."""

    status: Literal["done", "bad_input", "failed"]
    record: dict | None = None
    error: BaseException | None = None

    @property
    def kind(self) -> str:
        return "bad_input" if self.status == "bad_input" else type(self.error).__name__


def attempt_run(config_path: str | Path | None, overrides: list[str], run_dir: Path) -> Attempt:
    """Trains the run ``config_path`` + ``overrides`` describe in ``run_dir`` (see the module docstring)."""
    try:
        config = load_config(config_path, overrides)
        return Attempt("done", train(config, run_dir))
    except (ValueError, FileNotFoundError) as error:
        attempt = Attempt("bad_input", error=error)
    except OSError as error:
        attempt = Attempt("bad_input" if _path_error(error) else "failed", error=error)
    except (NonFiniteLoss, CheckpointError) as error:
        attempt = Attempt("failed", error=error)
    write_error(run_dir, attempt)
    return attempt


def attempt_together(config_paths: Sequence[str | Path], overrides: list[str],
                     run_dirs: Sequence[Path]) -> list[Attempt]:
    """`attempt_run` of each run, the runs trained together when their configs allow (`together_conflict`) and
    every input is good; otherwise each alone, so bad input or a failure is one run's alone."""
    from jaxformer.train.together import together_conflict, train_together  # it builds on this module's `train`

    try:
        configs = [load_config(path, overrides) for path in config_paths]
    except (ValueError, FileNotFoundError):
        configs = None  # one run's bad config: each alone, the bad one says why
    if configs is None or together_conflict(configs) is not None:
        return [attempt_run(path, overrides, run_dir) for path, run_dir in zip(config_paths, run_dirs)]
    try:
        results = train_together(configs, run_dirs)
    except (ValueError, FileNotFoundError):  # a run's own input is bad (a refused resume, say): each alone
        return [attempt_run(path, overrides, run_dir) for path, run_dir in zip(config_paths, run_dirs)]
    except OSError as error:
        if _path_error(error):  # one run's directory, say: each alone names its own
            return [attempt_run(path, overrides, run_dir) for path, run_dir in zip(config_paths, run_dirs)]
        results = [error] * len(run_dirs)  # a full disk stops the one program of every run
    attempts = []
    for run_dir, result in zip(run_dirs, results):
        attempts.append(Attempt("done", result) if isinstance(result, dict) else Attempt("failed", error=result))
        if attempts[-1].status == "failed":
            write_error(run_dir, attempts[-1])
    return attempts


def _path_error(error: OSError) -> bool:
    """Whether ``error`` is bad input (exit 2): met before the run directory was written, and the user's path."""
    return not isinstance(error, RunWriteError) and is_input_error(error)


def write_error(run_dir: Path, attempt: Attempt) -> None:
    """``RUN_DIR/error.json`` for a failed attempt (best effort; never into a directory holding a run on bad input,
    nor into one another process is training or that holds the user's files)."""
    holds_run = (run_dir / "config.yaml").is_file() or has_checkpoints(run_dir)
    if isinstance(attempt.error, (RunBusy, NotARunDirectory)) or attempt.status == "bad_input" and holds_run:
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / "error.json", {"error": attempt.kind, "message": str(attempt.error),
                                                   "time": time.time()})
    except OSError:
        pass
