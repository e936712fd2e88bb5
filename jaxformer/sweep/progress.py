"""The live view of a sweep: queued / running / done / failed, each run's loss and ETA (a running run's
newest logged loss, a done run's final validation loss).

A table taller than the terminal shows the runs being trained and those that failed first, then the next
queued and the latest finished, with the others counted below it (rich's own cropping kept the plan's first
rows and hid the ones training); the table left on screen at the end holds every run.

On a terminal the table redraws in place (``rich``); otherwise one plain line per change,
handed to the ``write`` callback the command supplies.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from jaxformer.sweep.runs import Outcome, RunPaths
from jaxformer.train.final import final_record

RULES = 5  # lines of a table besides its rows: the title, the header and three rules
STATES = ("queued", "submitted", "running", "done", "failed", "elsewhere")


def _last_metrics(path: Path) -> dict:
    """The newest row of a run's ``metrics.jsonl`` (empty before its first log line)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - 4096))
            lines = handle.read().decode(errors="replace").strip().splitlines()
        return json.loads(lines[-1]) if lines else {}
    except (OSError, json.JSONDecodeError):
        return {}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class SweepProgress:
    """Tracks every run's state; ``event`` is the executors' callback.

    ``live`` (default: stdout is a terminal) redraws a table in place; otherwise each change is
    one line passed to ``write``.
    """

    def __init__(self, sweep_dir: Path, runs: list[dict], initial: dict[str, str], write: Callable[[str], None],
                 live: bool | None = None) -> None:
        self.sweep_dir, self.runs, self.write = sweep_dir, runs, write
        self.state = dict(initial)
        self.reasons: dict[str, str] = {}
        self.live = sys.stdout.isatty() if live is None else live
        self.lock = threading.Lock()
        self.started = time.time()
        self._stop = threading.Event()
        self._display = None
        self._final_loss: dict[str, float | None] = {}  # a done run's record does not change: read once
        self._ended: dict[str, float] = {}  # when each run this launch trained ended (the latest are shown first)

    def event(self, name: str, what: str, outcome: Outcome | None) -> None:
        with self.lock:
            if outcome is None:
                self.state[name] = what
            else:
                self.state[name] = {"skipped": "done", "busy": "elsewhere"}.get(outcome.status, outcome.status)
                self._ended[name] = time.monotonic()
                if outcome.reason and outcome.status == "failed":
                    self.reasons[name] = outcome.reason
            if not self.live:  # under the lock: lines from two workers never interleave
                detail = f" ({outcome.reason})" if outcome and outcome.reason else ""
                wall = f" in {_duration(outcome.wall_s)}" if outcome and outcome.wall_s else ""
                self.write(f"[{self._counts()}] {name}: {self.state[name]}{wall}{detail}")

    def _counts(self, values: list[str] | None = None) -> str:
        """``queued 3 running 2 …`` of ``values`` (default: every run's state)."""
        values = list(self.state.values()) if values is None else values
        return " ".join(f"{label} {values.count(label)}" for label in STATES if values.count(label))

    def _shown(self, room: int, states: dict[str, str]) -> list[dict]:
        """At most ``room`` of the runs, in plan order: the running and failed ones, then the next queued, then the
        latest to end (``states``: each run's)."""
        order = {"running": 0, "submitted": 0, "failed": 1, "queued": 2}

        def rank(item: tuple[int, dict]) -> tuple:
            index, run = item
            state = states[run["name"]]
            return (order[state], index) if state in order else (3, -self._ended.get(run["name"], 0.0), index)

        chosen = sorted(enumerate(self.runs), key=rank)[:max(room, 1)]
        return [run for _, run in sorted(chosen, key=lambda item: item[0])]

    def _row(self, run: dict, state: str) -> tuple[str, ...]:
        name = run["name"]
        paths = RunPaths(self.sweep_dir, name)
        metrics = _last_metrics(paths.run_dir / "metrics.jsonl") if state == "running" else {}
        loss = metrics.get("val_loss") or metrics.get("train_loss")
        if state == "done":
            if name not in self._final_loss:
                final = final_record(paths.final)
                self._final_loss[name] = None if final is None else final["val_loss"]
            loss = self._final_loss[name]
        eta = None
        if metrics.get("tokens_per_s") and metrics.get("tokens") is not None:
            eta = max(0.0, run["D"] - metrics["tokens"]) / metrics["tokens_per_s"]
        return (name, f"{run['N']:,}", f"{run['D']:.3g}", f"{run['C']:.3g}", state,
                "" if loss is None else f"{loss:.4f}", _duration(eta))

    def table(self, height: int | None = None):
        """The table of every run, or of those `_shown` picks where they take more than ``height`` lines (a
        terminal's), the others counted in its caption."""
        from rich.table import Table

        with self.lock:  # one moment's states for the whole drawing: its title counts the rows it shows
            states = dict(self.state)
        shown = self.runs
        if height is not None and len(self.runs) > height - RULES:
            shown = self._shown(height - RULES - 1, states)  # a line for the caption
        names = {run["name"] for run in shown}
        hidden = [states[run["name"]] for run in self.runs if run["name"] not in names]
        title = (f"sweep {self.sweep_dir.name} — {self._counts(list(states.values()))} — "
                 f"{_duration(time.time() - self.started)}")
        table = Table(title=title, caption=f"{len(hidden)} more: {self._counts(hidden)}" if hidden else None)
        for column in ("run", "N", "D", "C", "state", "loss", "ETA"):
            table.add_column(column, justify="left" if column in ("run", "state") else "right")
        for run in shown:
            table.add_row(*self._row(run, states[run["name"]]))
        return table

    def _fitted(self):
        return self.table(self._display.console.height)

    def __enter__(self) -> "SweepProgress":
        if self.live:
            from rich.live import Live

            self._display = Live(refresh_per_second=1)
            self._display.update(self._fitted())
            self._display.__enter__()
            threading.Thread(target=self._refresh, daemon=True).start()
        return self

    def _refresh(self) -> None:
        while not self._stop.wait(1.0):
            self._display.update(self._fitted())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._display is not None:
            self._display.update(self.table())  # left on screen: every run
            self._display.__exit__(*exc)

    def summary(self) -> str:
        lines = [f"sweep {self.sweep_dir}: {self._counts()} in {_duration(time.time() - self.started)}"]
        lines += [f"  failed {name}: {reason}" for name, reason in self.reasons.items()]
        return "\n".join(lines)
