"""A warm sweep worker: one process that imports JAX once and trains runs back to back.

``python -m jaxformer.sweep.worker SWEEP_DIR`` reads run names, one per line, on stdin, and
answers each with one JSON line on stdout (an `Outcome`). Each run trains in this process
(`jaxformer.train.attempt.attempt_run`) under the run's lock, with the process's output
(file descriptors 1 and 2, so XLA's C++ logging too) appended to ``logs/NAME.log``. What a
warm process keeps between runs is what makes short runs cheap: the imports, the JAX backend,
the compiled train and eval steps of every shape it has trained (`jaxformer.train.loop`), the
tokenised corpus and the machine's measured matmul peak.

`WarmWorker` is the supervisor's side: it starts such a process, sends it runs, and replaces
it when it dies — a run that was training then is given to the new process, which resumes it
from its last checkpoint (once; a run that kills its worker twice is recorded as failed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Iterator

from jaxformer.sweep.runs import Outcome, RunPaths, failure_reason, run_lock

ATTEMPTS = 2  # a run whose worker dies is resumed once by a fresh worker


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Points file descriptors 1 and 2 (Python's and C++'s output alike) at ``path`` (appended)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def train_here(sweep_dir: Path, name: str) -> Outcome:
    """Trains run ``name`` in this process under its lock; its output goes to its log."""
    from jaxformer.train.attempt import attempt_run

    paths = RunPaths(sweep_dir, name)
    with run_lock(paths) as held:
        if not held:
            return Outcome(name, "busy", "another launch holds its lock")
        if paths.final.is_file():
            return Outcome(name, "skipped")
        paths.log.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with _output_to(paths.log):
            print(f"$ jaxformer train {paths.config} logging.progress=plain --run-dir {paths.run_dir} "
                  f"(worker {os.getpid()})", flush=True)
            attempt = attempt_run(paths.config, ["logging.progress=plain"], paths.run_dir)
            if attempt.status != "done":
                print(f"jaxformer train: error: {attempt.error}", flush=True)
        wall = time.perf_counter() - started
        if attempt.status == "done":
            paths.record("done", wall_s=wall, worker=os.getpid())
            return Outcome(name, "done", wall_s=wall)
        reason = failure_reason(paths, 2 if attempt.status == "bad_input" else 1)
        paths.record("failed", reason=reason, wall_s=wall, worker=os.getpid())
        return Outcome(name, "failed", reason, wall)


def serve(sweep_dir: Path, requests: IO[str], answers: IO[str]) -> None:
    """Answers each run name read from ``requests`` with the JSON of its `Outcome`, until end of input."""
    for line in requests:
        if line.strip():
            answers.write(json.dumps(dataclasses.asdict(train_here(sweep_dir, line.strip()))) + "\n")
            answers.flush()


class WarmWorker:
    """One worker process (started on first use), replaced when it dies."""

    def __init__(self, sweep_dir: Path, env: dict[str, str], log: Path) -> None:
        self.sweep_dir, self.env, self.log = Path(sweep_dir).absolute(), env, log
        self.process: subprocess.Popen | None = None
        self.started = 0  # processes started, for the record

    def _start(self) -> subprocess.Popen:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:  # the worker's own output between runs
            self.process = subprocess.Popen([sys.executable, "-m", "jaxformer.sweep.worker", str(self.sweep_dir)],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                            env=self.env, text=True, bufsize=1)
        self.started += 1
        return self.process

    def train(self, name: str) -> Outcome:
        """The run's outcome; a worker that dies is replaced and the run resumed, up to `ATTEMPTS` times."""
        for _ in range(ATTEMPTS):
            process = self.process if self.process and self.process.poll() is None else self._start()
            try:
                process.stdin.write(name + "\n")
                process.stdin.flush()
                answer = process.stdout.readline()
            except BrokenPipeError:
                answer = ""
            if answer:
                return Outcome(**json.loads(answer))
            self.process = None  # it died mid-run: the next attempt starts a fresh one
            code = process.wait()
        paths = RunPaths(self.sweep_dir, name)
        reason = f"its worker died {ATTEMPTS} times (exit status {code}); last output: {failure_reason(paths, code)}"
        paths.record("failed", reason=reason, returncode=code)
        return Outcome(name, "failed", reason)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait()


def main() -> None:
    sweep_dir = Path(sys.argv[1])
    answers = os.fdopen(os.dup(1), "w")  # runs' output goes to their logs; answers keep their own descriptor
    os.dup2(2, 1)
    serve(sweep_dir, sys.stdin, answers)


if __name__ == "__main__":
    main()
