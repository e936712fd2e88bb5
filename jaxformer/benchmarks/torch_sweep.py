"""The PyTorch twin of a sweep, for `jaxformer bench sweep` (PyTorch is a peer, not a dependency).

``python -m jaxformer.benchmarks.torch_sweep SWEEP_DIR --workers 2 --json twin.json`` trains, with a
plain PyTorch eager loop, the runs a finished ``jaxformer sweep`` trained into ``SWEEP_DIR``
(`replay_plan`: its ``plan.json`` and ``configs/``, and those of its tuning stage in ``tune/``), so
that both sides do the same work even where the plan depends on results: the tuning stage's runs,
then the main runs at the learning rates the fitted rule gave them, the sizes an adapt round added,
and, with ``branches``, each trunk once and every run as a cooldown branch of its trunk's state.
It runs on ``--workers`` long-lived worker processes (spawned, one run at a time each),
``--threads`` intra-op threads each (default 1), in stages with a barrier between them as
jaxformer's: the tuning runs; the trunks and the runs trained from scratch; the branches (the twin
trains adapt-added sizes in the middle stage, without the barrier jaxformer puts before them).
Per run it does the work jaxformer's run does (`jaxformer.benchmarks.torch_twin`). The parent
prepares each distinct data section once and hands the token arrays to the workers as .npy files
(the workers import neither JAX nor Orbax). The report carries the whole wall time, the parent's
preparation time (reading the plan, data, schedules: it imports JAX for them, while the workers
start and import PyTorch), when each worker was ready and every run's record. (`jaxformer bench sweep`
probes PyTorch's matmul peak itself, outside the twin's timed process.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from jaxformer.benchmarks.replay import replay_plan
from jaxformer.benchmarks.torch_twin import TwinRun, prepare_data, train_twin, twin_runs


# --- worker processes: set up once by the pool's initializer; the data arrive as .npy files, loaded once each ---
_DATA: dict[str, tuple[np.ndarray, np.ndarray]] = {}
_WORKER: dict[str, Any] = {}


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    import jaxformer.train.loader  # noqa: F401  (the data loader, imported before the first run)
    import jaxformer.benchmarks.torch_reference  # noqa: F401  (and the model)

    # the first AdamW of a process imports the rest of torch.optim (seconds): process start-up, not a run's
    weight = torch.nn.Parameter(torch.ones(2, 2))
    warm = torch.optim.AdamW([weight])
    weight.sum().backward()
    warm.step()
    _WORKER.update(ready=time.time())


def _train_in_worker(task: tuple[TwinRun, str]) -> dict:
    run, data_dir = task
    if run.data_key not in _DATA:
        index = json.loads((Path(data_dir) / "keys.json").read_text()).index(run.data_key)
        _DATA[run.data_key] = tuple(np.load(Path(data_dir) / f"{index}.{split}.npy") for split in ("train", "val"))
    record = train_twin(run, *_DATA[run.data_key])
    record.update(worker_ready=_WORKER["ready"])
    return record


def run_plan(sweep_dir: str | Path, *, workers: int, threads: int = 1, checkpoint_dir: str | None = None,
             schedules: str | Path | None = None, report=print) -> dict[str, Any]:
    """Trains the runs of the jaxformer sweep in ``sweep_dir`` (`replay_plan`), stage by stage, on ``workers``
    spawned processes of ``threads`` threads.

    The workers start (import PyTorch) while this process reads the plan and prepares the data.
    Returns the twin's report: ``wall_s`` from the pool's start to its end, ``prepare_s``, each
    worker's ready time, and every run's record in launch order.
    """
    import multiprocessing
    import tempfile

    started, started_epoch = time.perf_counter(), time.time()
    stages = replay_plan(sweep_dir)
    planned = [run for stage in stages for run in stage]
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_init_worker, initargs=(threads,)) as pool, \
            tempfile.TemporaryDirectory(prefix="jaxformer-twin-") as data_dir:
        given = None
        if schedules is not None:
            with np.load(schedules) as arrays:
                given = {name: arrays[name] for name in arrays.files}
        runs = twin_runs(planned, checkpoint_dir=checkpoint_dir, fork_dir=str(Path(data_dir) / "forks"),
                         schedules=given)
        by_name = {run.name: run for run in runs}
        datasets = prepare_data(planned)
        keys = list(datasets)
        for index, key in enumerate(keys):
            for split, tokens in zip(("train", "val"), datasets[key]):
                np.save(Path(data_dir) / f"{index}.{split}.npy", tokens)
        (Path(data_dir) / "keys.json").write_text(json.dumps(keys))
        prepare_s = time.perf_counter() - started
        records = []
        for stage in stages:  # a barrier between stages, as jaxformer's sweep has
            tasks = [(by_name[run.name], data_dir) for run in stage]
            for record in pool.imap_unordered(_train_in_worker, tasks, chunksize=1):
                records.append(record)
                report(f"torch twin: {record['name']} done in {record['time']['total_s']:.1f}s "
                       f"(val loss {record['val_loss']:.3f}), {len(records)}/{len(runs)}")
        pool.close()
        pool.join()
    wall_s = time.perf_counter() - started
    order = {run.name: index for index, run in enumerate(runs)}
    records.sort(key=lambda record: order[record["name"]])
    ready = sorted({record["worker_ready"] - started_epoch for record in records})
    return {"wall_s": wall_s, "prepare_s": prepare_s, "workers": workers, "threads": threads,
            "schedules": "given (--schedules)" if schedules is not None else "computed by learning_rates",
            "worker_ready_s": ready, "runs": records}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxformer.benchmarks.torch_sweep",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", help="a finished jaxformer sweep's --out directory, whose runs the twin trains")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch intra-op threads per worker")
    parser.add_argument("--checkpoints", help="torch.save model and optimizer here at checkpoint.interval steps")
    parser.add_argument("--schedules", help=".npz of every run's learning_rates array (save_schedules), "
                        "else computed here")
    parser.add_argument("--json", help="write the twin's report here")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.threads < 1:
        parser.error("--workers and --threads must be positive")
    try:
        result = run_plan(args.sweep_dir, workers=args.workers, threads=args.threads, checkpoint_dir=args.checkpoints,
                          schedules=args.schedules, report=lambda line: print(line, flush=True))
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"torch twin: {len(result['runs'])} runs in {result['wall_s']:.1f}s on {args.workers} workers × "
          f"{args.threads} threads", flush=True)
    if args.json:
        from jaxformer.files import write_json_atomic

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(args.json), result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
