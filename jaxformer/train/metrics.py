"""What a run reports: ``metrics.jsonl`` rows, TensorBoard scalars, a progress bar or plain lines.

Rows are written at log and evaluation steps only (that is where the loop synchronises
with the device). Units: losses in nats/token, ``*_bits_per_byte`` in bits per byte of
text, ``lr`` per update, ``tokens_per_s`` target tokens per second of training time,
``mfu`` the fraction of the probed matmul peak reached by the exact training FLOPs.
On resume, rows after the restored step are dropped first, so a resumed run's file is
the same as an uninterrupted run's; so are the TensorBoard summaries of those steps, from the event files
written before (`jaxformer.train.events`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Literal

from jaxformer.configs import POSITIVE, Section, setting
from jaxformer.files import write_text_atomic
from jaxformer.train.events import drop_summaries_after


@dataclasses.dataclass(frozen=True)
class LoggingConfig(Section):
    """Metrics every ``interval`` steps; ``progress``: ``auto`` (a bar on a terminal, else plain lines)."""

    SECTION = "logging"

    interval: int = setting(10, POSITIVE)
    progress: Literal["auto", "bar", "plain", "none"] = "auto"
    tensorboard: bool = True


def last_logged(path: Path, key: str) -> float | None:
    """The last value of ``key`` in ``metrics.jsonl`` (after resume truncation), for the final record."""
    value = None
    if path.exists():
        for line in path.read_text().splitlines():
            value = json.loads(line).get(key, value)
    return value


def truncate_rows(path: Path, last_step: int) -> None:
    """Keeps the rows of ``metrics.jsonl`` with ``step <= last_step`` (atomic rewrite)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        if row.get("step", math.inf) <= last_step:
            kept.append(line)
    write_text_atomic(path, "".join(line + "\n" for line in kept))


def _summary_writer(logdir: Path, purge_step: int):
    """A tensorboardX ``SummaryWriter`` that drops events after ``purge_step - 1`` (resume): a restart marker for
    TensorBoard, and the summaries of those steps taken out of the event files written before.

    tensorboardX imports PyTorch when it is installed, only to accept torch tensors; that
    import costs seconds per run, so it is held off while tensorboardX loads.
    """
    held_off = "torch" not in sys.modules
    if held_off:
        sys.modules["torch"] = None  # makes `import torch` raise ImportError, which tensorboardX handles
    try:
        from tensorboardX import SummaryWriter
    finally:
        if held_off:
            del sys.modules["torch"]
    drop_summaries_after(logdir, purge_step - 1)  # reads tensorboardX's protos, imported above without PyTorch
    return SummaryWriter(str(logdir), purge_step=purge_step)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else f"{rest // 60}m{rest % 60:02d}s"


class MetricsLogger:
    """Appends rows to ``metrics.jsonl``, mirrors them to TensorBoard and the terminal."""

    def __init__(self, run_dir: Path, *, start_step: int, total_steps: int, progress: str, tensorboard: bool) -> None:
        self.path = run_dir / "metrics.jsonl"
        truncate_rows(self.path, start_step)
        self.file = open(self.path, "a")
        self.total_steps = total_steps
        self.writer = None
        if tensorboard:
            self.writer = _summary_writer(run_dir / "tensorboard", purge_step=start_step + 1)
        if progress == "auto":
            progress = "bar" if sys.stderr.isatty() else "plain"
        self.mode = progress
        self.bar = None
        if progress == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)
        self.start_step = start_step
        # (perf_counter seconds, step) when this process began to train, for the ETA of plain lines: set by the
        # first `advance`, so the start-up, restore and compile before it are not read as the steps' pace
        self._segment: tuple[float, int] | None = None

    def advance(self, steps: int = 1) -> None:
        """Moves the progress bar (no device synchronisation). The loop calls it after each step's dispatch: the
        first call, once the step's programs are compiled, starts the clock of the plain lines' ETA."""
        if self._segment is None:
            self._segment = (time.perf_counter(), self.start_step)
        if self.bar is not None:
            self.bar.update(steps)

    def log(self, row: dict) -> None:
        """Writes one row (``step`` required); None values are kept in the file, skipped elsewhere."""
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        values = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, value, row["step"])
            self.writer.flush()
        summary = self._summary(row)
        if self.bar is not None:
            self.bar.set_postfix_str(summary, refresh=True)
        elif self.mode == "plain":
            print(f"step {row['step']}/{self.total_steps} | {summary}{self._eta(row['step'])}", flush=True)

    def _summary(self, row: dict) -> str:
        parts = []
        if row.get("train_loss") is not None:
            parts.append(f"loss {row['train_loss']:.4f}")
        if row.get("val_loss") is not None:
            bpb = row.get("val_bits_per_byte")
            parts.append(f"val {row['val_loss']:.4f}" + (f" ({bpb:.3f} bpb)" if bpb is not None else ""))
        if row.get("lr") is not None:
            parts.append(f"lr {row['lr']:.2e}")
        if row.get("tokens_per_s"):
            parts.append(f"{row['tokens_per_s']:,.0f} tok/s")
        if row.get("mfu") is not None:
            parts.append(f"MFU {row['mfu']:.1%}")
        return " | ".join(parts)

    def _eta(self, step: int) -> str:
        """`` | ETA …``: the seconds since the first step of this process per step done since (evaluations and
        checkpoints included, as they recur), times the steps left; empty before the first step and at the last."""
        if self._segment is None or step >= self.total_steps or step <= self._segment[1]:
            return ""
        start_time, start_step = self._segment
        done = step - start_step
        remaining = (time.perf_counter() - start_time) / done * (self.total_steps - step)
        return f" | ETA {format_duration(remaining)}"

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()
        if self.bar is not None:
            self.bar.close()
