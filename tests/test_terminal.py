"""What a user sees on a terminal: `jaxformer sweep`'s live table (``rich``) and `jaxformer train`'s progress bar
(``tqdm``), each from the command in a fresh process whose output is a pseudo-terminal, as in a user's shell."""

import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

from rich.console import Console

from jaxformer.sweep.progress import SweepProgress, _duration
from jaxformer.sweep.runs import Outcome
from jaxformer.train.final import final_record
from sweep_helpers import TINY

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ROW = re.compile(r"│ (\S+) +│ +([\d,]+) │ +(\S+) │ +(\S+) │ (\S+) +│ +(\S*) │ +(\S*) │")
TINY_RUN = ["model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.max_seq_len=64",
            "data.corpus=synthetic-markov", "data.markov.bytes=200000", "train.batch_size=8", "train.seq_len=32",
            "train.tokens=5120", "train.eval_tokens=1024", "checkpoint.interval=10", "logging.interval=5",
            "logging.tensorboard=false"]


def on_terminal(*args: str, columns: int = 160, lines: int = 50) -> tuple[int, str]:
    """``jaxformer ARGS`` with stdout and stderr on a pseudo-terminal of ``columns`` × ``lines``: its exit code and
    what the terminal received, escape sequences removed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES", "TERM")}
    process = subprocess.Popen([sys.executable, "-m", "jaxformer.cli", *args], stdin=subprocess.DEVNULL,
                               stdout=follower, stderr=follower,
                               env={**env, "TERM": "xterm-256color", "PYTHONIOENCODING": "utf-8"})  # rich's box lines
    os.close(follower)
    received = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: every holder of the terminal's other end has closed it
            break
        if not chunk:
            break
        received += chunk
    os.close(leader)
    return process.wait(timeout=600), ANSI.sub("", received.decode(errors="replace"))


def test_a_sweep_on_a_terminal_draws_its_table_in_place_and_ends_on_each_runs_final_loss(tmp_path):
    """The live table (not a line per change) whose last drawing shows every run done with its final validation
    loss, the planned N, D and C in each row, then the one-line summary."""
    out = tmp_path / "sweep"
    code, text = on_terminal("sweep", str(TINY), "--out", str(out))
    assert code == 0, text[-3000:]
    plan = {run["name"]: run for run in json.loads((out / "plan.json").read_text())["runs"]}
    assert len(plan) == 4
    assert not re.search(r"^\[.*\] C\S+: (running|done)", text, re.M)  # the plain lines are for pipes and files
    last = text[text.rindex(f"sweep {out.name} — done 4 — "):]
    rows = {match[0]: match[1:] for match in ROW.findall(last)}
    assert set(rows) == set(plan)
    for name, (n, d, c, state, loss, eta) in rows.items():
        final = final_record(out / "runs" / name / "final.json")
        assert (int(n.replace(",", "")), float(d), float(c)) == (plan[name]["N"], float(f"{plan[name]['D']:.3g}"),
                                                                 float(f"{plan[name]['C']:.3g}"))
        assert (state, loss, eta) == ("done", f"{final['val_loss']:.4f}", "")
    assert re.search(rf"sweep {re.escape(str(out))}: done 4 in \d+m\d\ds", last)


def test_the_table_shows_a_running_runs_newest_loss_and_the_time_its_tokens_left_take(tmp_path):
    """A running run: the newest metrics row's validation loss (else its training loss) and (D − tokens) /
    tokens_per_s; a queued run: neither; a done run whose final.json is damaged: no loss."""
    runs = [{"name": name, "N": 8240, "D": 40_000, "C": 2e9} for name in ("a", "b", "c", "d")]
    for name, rows in (("a", [{"step": 5, "train_loss": 3.0, "tokens": 1280, "tokens_per_s": 100.0},
                              {"step": 10, "train_loss": 2.5, "tokens": 2560, "tokens_per_s": 250.0}]),
                       ("b", [{"step": 10, "train_loss": 2.5, "val_loss": 2.75, "tokens": 4000,
                               "tokens_per_s": 9.0}])):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "runs" / "d").mkdir()
    (tmp_path / "runs" / "d" / "final.json").write_text("{")
    progress = SweepProgress(tmp_path, runs, {"a": "running", "b": "running", "c": "queued", "d": "done"},
                             write=lambda line: None, live=False)
    rows = {match[0]: match[4:] for match in ROW.findall(_text(progress.table()))}
    assert rows == {"a": ("running", "2.5000", "2m29s"),  # (40,000 − 2,560) / 250 = 149.76 s
                    "b": ("running", "2.7500", "1h06m"),  # (40,000 − 4,000) / 9 = 4,000 s
                    "c": ("queued", "", ""), "d": ("done", "", "")}


def test_training_on_a_terminal_shows_a_bar_of_the_steps_with_the_newest_losses(tmp_path):
    """``logging.progress: auto`` on a terminal: tqdm's bar to the last step, its postfix the newest row's loss
    and validation loss as metrics.jsonl holds them, and none of the plain lines a pipe gets."""
    (tmp_path / "empty.yaml").write_text("{}\n")
    run_dir = tmp_path / "run"
    code, text = on_terminal("train", str(tmp_path / "empty.yaml"), *TINY_RUN, "--run-dir", str(run_dir))
    assert code == 0, text[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["step"] == 20 and last.get("val_loss") is not None
    assert re.search(rf"20/20 \[[^\]]*, loss {last['train_loss']:.4f} \| val {last['val_loss']:.4f}", text), \
        text[-2000:]
    assert not re.search(r"^step \d+/20 \|", text, re.M)


def test_a_terminal_shorter_than_the_table_shows_the_runs_training_and_counts_the_others(tmp_path):
    """Eight lines hold two of the four runs: each drawing shows every running run (rich's cropping showed the
    plan's first rows and "...", the runs training below them unseen), the rest counted; the last holds all."""
    out = tmp_path / "sweep"
    code, text = on_terminal("sweep", str(TINY), "--out", str(out), lines=8)
    assert code == 0, text[-3000:]
    *drawings, last = re.split(rf"sweep {out.name} — ", text)[1:]
    assert drawings and "..." not in text
    for drawing in drawings:
        rows = ROW.findall(drawing)
        running = re.match(r".*?running (\d+)", drawing.splitlines()[0])
        assert [row[4] for row in rows].count("running") == (int(running[1]) if running else 0), drawing
        assert len(rows) == 2 and f"{4 - len(rows)} more: " in drawing, drawing
    assert len(ROW.findall(last)) == 4 and "more:" not in last


def test_the_rows_a_short_table_shows_are_the_running_failed_next_queued_and_latest_done_in_plan_order(tmp_path):
    runs = [{"name": f"r{i}", "N": 8240, "D": 40_000, "C": 2e9} for i in range(10)]
    states = ["done", "done", "failed", "done", "done", "running", "queued", "queued", "running", "queued"]
    progress = SweepProgress(tmp_path, runs, {f"r{i}": "queued" for i in range(10)}, write=lambda line: None,
                             live=False)
    for i in (3, 0, 2, 4, 1):  # the order the runs ended: r1 last, r4 before it
        progress.event(f"r{i}", "", Outcome(f"r{i}", states[i]))
    for i in (5, 8):
        progress.event(f"r{i}", "running", None)

    def shown(height):
        text = _text(progress.table(height))
        return [match[0] for match in ROW.findall(text)], text

    names, text = shown(5 + 1 + 6)  # the rules, a caption and six rows
    assert names == ["r2", "r5", "r6", "r7", "r8", "r9"] and "4 more: done 4" in text
    names, text = shown(5 + 1 + 8)
    assert names == ["r1", "r2", "r4", "r5", "r6", "r7", "r8", "r9"] and "2 more: done 2" in text
    for height in (5 + 10, None):  # every row fits: no caption
        names, text = shown(height)
        assert names == [f"r{i}" for i in range(10)] and "more:" not in text


def test_a_short_table_ranks_training_runs_then_failed_then_queued_whatever_their_plan_order():
    runs = [{"name": name, "N": 8240, "D": 40_000, "C": 2e9} for name in ("q0", "f1", "s2", "r3")]
    progress = SweepProgress(Path("/nonexistent"), runs, {"q0": "queued", "f1": "queued", "s2": "submitted",
                                                          "r3": "running"}, write=lambda line: None, live=False)
    progress.event("f1", "", Outcome("f1", "failed", "exit code 1"))
    for room, expected in ((1, ["s2"]), (2, ["s2", "r3"]), (3, ["f1", "s2", "r3"]), (4, ["q0", "f1", "s2", "r3"])):
        assert [run["name"] for run in progress._shown(room, dict(progress.state))] == expected, room


def test_without_a_terminal_each_change_is_one_line_of_the_counts_and_the_summary_names_the_failed_runs():
    lines = []
    runs = [{"name": name, "N": 8240, "D": 40_000, "C": 2e9} for name in ("a", "b", "c")]
    progress = SweepProgress(Path("/nonexistent"), runs, dict.fromkeys(("a", "b", "c"), "queued"), lines.append,
                             live=False)
    progress.event("a", "running", None)
    progress.event("a", "", Outcome("a", "done", wall_s=65.4))
    progress.event("b", "", Outcome("b", "failed", "exit code 1", wall_s=3725.0))
    progress.event("c", "", Outcome("c", "busy", "training in another launch"))
    assert lines == ["[queued 2 running 1] a: running", "[queued 2 done 1] a: done in 1m05s",
                     "[queued 1 done 1 failed 1] b: failed in 1h02m (exit code 1)",
                     "[done 1 failed 1 elsewhere 1] c: elsewhere (training in another launch)"]
    assert re.fullmatch(r"sweep /nonexistent: done 1 failed 1 elsewhere 1 in 0m0\ds\n  failed b: exit code 1",
                        progress.summary())
    assert re.search(r"sweep nonexistent — done 1 failed 1 elsewhere 1 — 0m0\ds", _text(progress.table()))


def test_a_running_runs_eta_needs_a_rate_and_a_token_count_and_its_loss_is_the_newest_row_of_a_long_log(tmp_path):
    """No ETA from a row without a rate or a token count, none below zero past D; the loss of the last row of a
    log longer than the 4 KiB read from its end."""
    runs = [{"name": name, "N": 8240, "D": 40_000, "C": 2e9} for name in ("a", "b", "c", "d")]
    for name, rows in (("a", [{"step": 10, "val_loss": 2.75, "tokens": 4000}]),
                       ("b", [{"step": 10, "train_loss": 2.5, "tokens_per_s": 9.0}]),
                       ("c", [{"step": 10, "train_loss": 2.25, "tokens": 50_000, "tokens_per_s": 0.5}]),
                       ("d", [{"step": step, "train_loss": 9 - step / 1000, "tokens": 100 * step,
                               "tokens_per_s": 300.0} for step in range(1, 501)])):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert (tmp_path / "runs" / "d" / "metrics.jsonl").stat().st_size > 4 * 4096
    progress = SweepProgress(tmp_path, runs, dict.fromkeys("abcd", "running"), write=lambda line: None, live=False)
    rows = {match[0]: match[4:] for match in ROW.findall(_text(progress.table()))}
    assert rows == {"a": ("running", "2.7500", ""), "b": ("running", "2.5000", ""),
                    "c": ("running", "2.2500", "0m00s"), "d": ("running", "8.5000", "0m00s")}


def test_durations_read_in_minutes_and_seconds_below_an_hour_and_hours_and_minutes_from_it():
    assert [_duration(s) for s in (None, 0, 59.9, 60, 3599, 3600, 3661, 7140, 36_000)] == \
        ["", "0m00s", "0m59s", "1m00s", "59m59s", "1h00m", "1h01m", "1h59m", "10h00m"]


def _text(table) -> str:
    """The table as a 160-column terminal shows it, as plain text."""
    console = Console(file=io.StringIO(), width=160, record=True)
    console.print(table)
    return console.export_text()
