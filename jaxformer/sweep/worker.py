"""A warm sweep worker: one process that imports JAX once and trains runs back to back.

``python -m jaxformer.sweep.worker`` reads requests, one per line, on stdin: a sweep directory and a run
name, separated by a tab; it answers each run with one JSON line on stdout (an `Outcome`). A request of
several names (each after a tab) is a group: the worker takes every run's lock, skips the finished ones, removes
a damaged ``final.json`` (`jaxformer.sweep.runs`: the run trains again) and trains the others together as one
program (`jaxformer.train.together`; alone when they cannot), with the group's output in its first run's log.
An exception no attempt names fails the runs it was training (its traceback in the log, its line in their
``error.json``), not the process. Each run trains in this process
(`jaxformer.train.attempt.attempt_run`) under the run's lock, with the process's output
(file descriptors 1 and 2, so XLA's C++ logging too) appended to ``logs/NAME.log``. What a
warm process keeps between runs is what makes short runs cheap: the imports, the JAX backend,
the compiled train and eval steps of every shape it has trained (`jaxformer.train.loop`), the
tokenised corpus and the machine's measured matmul peak. Since a request names its sweep directory,
one process serves every stage of a launch (the tuning stage's directory, then the sweep's own).

`WarmWorker` is the supervisor's side: it starts such a process, sends it runs, and replaces
it when it dies — a run that was training then is given to the new process, which resumes it
from its last checkpoint (once; a run that kills its worker twice is recorded as failed). The
runs of a group whose worker died train alone, one at a time, each resuming from its checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Iterator, Sequence

from jaxformer.sweep.runs import Outcome, RunPaths, failure_reason, run_lock

ATTEMPTS = 2  # a run whose worker dies is resumed once by a fresh worker
STOP_GRACE_S = 10.0  # how long a worker sent SIGINT may take to end before it is killed


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


def train_group_here(sweep_dir: Path, names: Sequence[str]) -> list[Outcome]:
    """Trains the runs ``names`` (one, or a group) in this process under their locks, together where they can;
    one outcome each. The output goes to the log of the first run trained; the others' logs say where it is."""
    from jaxformer.train.attempt import Attempt, attempt_together, write_error

    outcomes: dict[str, Outcome] = {}
    with contextlib.ExitStack() as locks:
        todo = []
        for paths in (RunPaths(sweep_dir, name) for name in names):
            if not locks.enter_context(run_lock(paths)):
                outcomes[paths.name] = Outcome(paths.name, "busy", "another launch holds its lock")
            elif (state := paths.state()) == "done":
                outcomes[paths.name] = Outcome(paths.name, "skipped")
            else:
                if state == "damaged":  # replaced by the record of this attempt, never read as a finished run's
                    paths.final.unlink()
                todo.append(paths)
        if todo:
            for paths in todo:
                paths.log.parent.mkdir(parents=True, exist_ok=True)
            for paths in todo[1:]:
                with open(paths.log, "a") as log:
                    print(f"$ trained together with {', '.join(p.name for p in todo if p is not paths)} "
                          f"(worker {os.getpid()}): the output is in {todo[0].log}", file=log)
            started = time.perf_counter()
            with _output_to(todo[0].log):
                together = f" together with {', '.join(p.name for p in todo[1:])}" if len(todo) > 1 else ""
                print(f"$ jaxformer train {todo[0].config} logging.progress=plain --run-dir {todo[0].run_dir}"
                      f"{together} (worker {os.getpid()})", flush=True)
                try:
                    attempts = attempt_together([p.config for p in todo], ["logging.progress=plain"],
                                                [p.run_dir for p in todo])
                except Exception as error:  # an error no attempt names (a bug, an accelerator's OOM): these runs
                    with open(todo[0].log, "a") as log:  # fail with it; the warm process serves the others
                        traceback.print_exc(file=log)
                    attempts = [Attempt("failed", error=error) for _ in todo]
                    for paths, attempt in zip(todo, attempts):
                        write_error(paths.run_dir, attempt)
                for paths, attempt in zip(todo, attempts):
                    if attempt.status != "done":
                        print(f"jaxformer train: error: {paths.name + ': ' if together else ''}{attempt.error}",
                              flush=True)
            wall = time.perf_counter() - started
            for paths, attempt in zip(todo, attempts):
                outcomes[paths.name] = _settle(paths, attempt, wall)
    return [outcomes[name] for name in names]


def _settle(paths: RunPaths, attempt, wall: float) -> Outcome:
    """The sweep's record of one attempt (status/NAME.json) and its `Outcome`; a failure's reason is what its
    ``error.json`` says (`jaxformer.train.attempt.write_error`), also where none was written."""
    if attempt.status == "done":
        paths.record("done", wall_s=wall, worker=os.getpid())
        return Outcome(paths.name, "done", wall_s=wall)
    reason = f"{attempt.kind}: {attempt.error}"
    paths.record("failed", reason=reason, wall_s=wall, worker=os.getpid())
    return Outcome(paths.name, "failed", reason, wall)


def serve(requests: IO[str], answers: IO[str]) -> None:
    """Answers each request read from ``requests`` (a sweep directory, then a run name or the names of a group,
    tab-separated) with one JSON line per run (its `Outcome`), until end of input."""
    for line in requests:
        fields = [field for field in line.rstrip("\n").split("\t") if field]
        if len(fields) > 1:
            for outcome in train_group_here(Path(fields[0]), fields[1:]):
                answers.write(json.dumps(dataclasses.asdict(outcome)) + "\n")
            answers.flush()


class WarmWorker:
    """One worker process (started on first use), replaced when it dies."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.process: subprocess.Popen | None = None
        self.started = 0  # processes started, for the record
        self.interrupted = False  # Ctrl-C: a process that ends is not replaced

    def _start(self) -> subprocess.Popen:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:  # the worker's own output between runs
            self.process = subprocess.Popen([sys.executable, "-m", "jaxformer.sweep.worker"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                            env=self.env, text=True, bufsize=1)
        self.started += 1
        return self.process

    def train(self, sweep_dir: Path, name: str) -> Outcome:
        """The outcome of run ``name`` of ``sweep_dir``; a worker that dies is replaced and the run resumed, up to
        `ATTEMPTS` times."""
        sweep_dir = Path(sweep_dir).absolute()
        for _ in range(ATTEMPTS):
            process = self.process if self.process and self.process.poll() is None else self._start()
            try:
                process.stdin.write(f"{sweep_dir}\t{name}\n")
                process.stdin.flush()
                answer = process.stdout.readline()
            except BrokenPipeError:
                answer = ""
            if answer:
                return Outcome(**json.loads(answer))
            self.process = None  # it died mid-run: the next attempt starts a fresh one
            code = process.wait()
            self._stop_when_interrupted(code)
        paths = RunPaths(sweep_dir, name)
        reason = f"its worker died {ATTEMPTS} times (exit status {code}); last output: {failure_reason(paths, code)}"
        paths.record("failed", reason=reason, returncode=code)
        return Outcome(name, "failed", reason)

    def train_group(self, sweep_dir: Path, names: Sequence[str]) -> list[Outcome]:
        """The outcomes of the runs ``names`` of ``sweep_dir``, trained together in one request; when the worker
        dies during it, the runs it did not answer train alone, one at a time (`train`), each resuming from its
        checkpoints."""
        if len(names) == 1:
            return [self.train(sweep_dir, names[0])]
        process = self.process if self.process and self.process.poll() is None else self._start()
        answers = []
        try:
            process.stdin.write("\t".join([str(Path(sweep_dir).absolute()), *names]) + "\n")
            process.stdin.flush()
            while len(answers) < len(names) and (answer := process.stdout.readline()):
                answers.append(Outcome(**json.loads(answer)))
        except BrokenPipeError:
            pass
        if len(answers) < len(names):  # it died mid-group
            self.process = None
            self._stop_when_interrupted(process.wait())
            answered = {outcome.name for outcome in answers}
            answers += [self.train(sweep_dir, name) for name in names if name not in answered]
        return answers

    def interrupt(self, deadline: float) -> None:
        """Ends the process's run as Ctrl-C does: when it has not ended by ``deadline`` (`time.monotonic`; the
        terminal's Ctrl-C reaches the whole process group), one SIGINT is sent to it. It is not replaced."""
        self.interrupted = True
        if self._running_at(deadline):
            self.process.send_signal(signal.SIGINT)

    def end_by(self, deadline: float) -> None:
        """Kills the process if it runs at ``deadline`` (`time.monotonic`), after `interrupt`: one that does not end
        on SIGINT would hold the launch for ever (one was seen spinning in ``malloc`` after it, its heap corrupt).
        Its run resumes from its last checkpoint at a relaunch, as an interrupted one does."""
        if self._running_at(deadline):
            print(f"worker process {self.process.pid} did not end on its SIGINT: killed (its run resumes from its "
                  "last checkpoint at a relaunch)", file=sys.stderr, flush=True)
            self.process.kill()
            self.process.wait()

    def _running_at(self, deadline: float) -> bool:
        """Whether the process still runs at ``deadline`` (`time.monotonic`), waiting for it until then."""
        if self.process is None:
            return False
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return True
        return False

    def _stop_when_interrupted(self, code: int) -> None:
        """A worker ended by Ctrl-C (SIGINT), or killed after it, is not replaced: the launch stops, its run resumes
        at a relaunch."""
        if code == -signal.SIGINT or self.interrupted:
            raise KeyboardInterrupt

    def stop(self) -> None:
        """Tells the process to end (end of input) without waiting; `close` waits."""
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()

    def close(self) -> None:
        self.stop()
        if self.process is not None:
            self.process.wait()


def main() -> None:
    from jaxformer.runtime import run_inline_on_cpu
    from jaxformer.train.interrupts import raise_swallowed_interrupts
    from jaxformer.train.late_reports import ignore_failed_write_tracebacks, ignore_reads_outliving_their_loop

    raise_swallowed_interrupts()  # a Ctrl-C in JAX's gc callback ends the worker's run, as anywhere else
    ignore_reads_outliving_their_loop()  # a failed restore's late reports, for the worker's whole life
    ignore_failed_write_tracebacks()  # and Orbax's tracebacks of a failed checkpoint write, raised in one line
    run_inline_on_cpu()  # a worker's runs are one-device programs (a device per thread): no page faults on scratch
    answers = os.fdopen(os.dup(1), "w")  # runs' output goes to their logs; answers keep their own descriptor
    os.dup2(2, 1)
    serve(sys.stdin, answers)
    # every run has answered, so its files are written and its threads joined: skip Python's teardown of JAX,
    # which the supervisor would wait for (a third of a second at the end of every sweep)
    answers.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
