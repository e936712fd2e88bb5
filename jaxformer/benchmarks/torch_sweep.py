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
Per run it does the work jaxformer's run does:

- the same model (`torch_reference.TorchDecoder`: dense pre-norm decoders; other
  architectures are refused in one line naming the field), fp32, or its forward under
  ``torch.autocast`` (bf16) where the run computes in bfloat16 (``train.compute_dtype``), as
  `torch_reference.make_torch_step` times it: fp32 parameters and optimizer, bf16 matmuls;
- ``steps = train.tokens / (batch_size · seq_len)`` optimizer steps of ``grad_accum``
  micro-batches, on the windows jaxformer's `Loader` cuts from the same training split
  (`prepare_dataset`, run once per distinct data section in the parent, which hands the
  token arrays to the workers as .npy files: the workers import neither JAX nor Orbax);
- AdamW with the run's betas, eps and weight decay (matrices only, as jaxformer's
  `decay_mask`), global-norm clipping, at the learning rate of jaxformer's own schedule
  array (`jaxformer.train.optimizer.learning_rates`) set before every update. Evaluating
  it costs a JAX compile per distinct run length (about a second each), which a PyTorch
  script would not pay: `jaxformer bench sweep` computes the arrays beforehand
  (`save_schedules`) and hands them over with ``--schedules FILE.npz``;
- a branch starts from its trunk's model, optimizer and data position at its fork step
  (``torch.save`` by the trunk, ``torch.load`` by the branch, both counted as checkpoint time)
  and trains the remaining steps of its own schedule;
- the training loss read at ``logging.interval`` steps and a final validation pass over the
  same ``eval_tokens`` windows (`eval_batches`); optionally a ``torch.save`` of model and
  optimizer at ``checkpoint.interval`` steps and the last, skipping interval saves past
  ``checkpoint.max_overhead`` as jaxformer does (``--checkpoints DIR``).

Each run's record carries ``time``: ``startup_s`` (model and optimizer), ``data_s`` (batches),
``train_s`` (the updates), ``eval_s``, ``checkpoint_s``, ``total_s``; the report carries the
whole wall time, the parent's preparation time (reading the plan, data, schedules: it imports
JAX for them, while the workers start and import PyTorch) and when each worker was ready.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from jaxformer.architecture import ModelConfig
from jaxformer.benchmarks.replay import replay_plan

# what the twin covers of ModelConfig and LoopConfig: anything else is refused before any run starts
POSITIONS = ("learned", "rope", "none")


@dataclasses.dataclass(frozen=True)
class TwinRun:
    """Everything a worker needs to train one planned run (picklable, no JAX objects)."""

    name: str
    model: ModelConfig
    steps: int
    batch_size: int
    seq_len: int
    grad_accum: int
    seed: int
    learning_rates: np.ndarray  # [steps] float32, jaxformer's schedule
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    grad_clip: float
    log_interval: int
    checkpoint_interval: int
    eval_tokens: int
    data_key: str
    flops_exact: float
    autocast: bool = False  # the forward under torch.autocast(bf16): the run's compute_dtype is bfloat16
    initial_params: str | None = None  # a .pt state dict to start from (jaxformer's own initial parameters, say)
    record_lrs: bool = False
    checkpoint_dir: str | None = None
    checkpoint_max_overhead: float | None = None  # as checkpoint.max_overhead: skip interval saves past it
    trunk: str | None = None  # a branch: the trunk whose state at fork_step it continues from
    fork_step: int | None = None
    forks: tuple[int, ...] = ()  # a trunk: the steps its branches fork at (its state is saved there)
    fork_dir: str | None = None  # where trunks leave those states


def unsupported(config) -> str | None:
    """Why the twin cannot train ``config`` (a `TrainConfig`), in one phrase naming the field; None if it can."""
    model = config.model
    if model.family != "decoder":
        return f"model.family={model.family!r} (the twin trains decoders only)"
    if model.is_moe:
        return f"model.num_experts={model.num_experts} (the twin is dense)"
    if model.norm_position != "pre":
        return f"model.norm_position={model.norm_position!r} (the twin is pre-norm)"
    if model.position not in POSITIONS:
        return f"model.position={model.position!r} (the twin has {', '.join(POSITIONS)})"
    if model.sliding_window:
        return f"model.sliding_window={model.sliding_window} (the twin attends to the whole context)"
    if model.activation in ("geglu", "geglu_tanh"):
        return f"model.activation={model.activation!r} (the twin's gate is SiLU)"
    if model.attention_scale is not None or model.scale_head_inputs:
        return "model.attention_scale / scale_head_inputs (the twin scales as GPT-2 does)"
    return None


def check_supported(planned: list) -> None:
    """``ValueError``, one line naming the run and the field, on the first run (``.name``, ``.config``) the twin
    cannot train."""
    from jaxformer.train.config import config_from_dict

    for run in planned:
        reason = unsupported(config_from_dict(dict(run.config)))
        if reason is not None:
            raise ValueError(f"run {run.name}: the PyTorch twin cannot train {reason}")


def twin_runs(planned: list, *, checkpoint_dir: str | None = None, fork_dir: str | None = None,
              schedules: dict[str, np.ndarray] | None = None) -> list[TwinRun]:
    """`TwinRun`s of planned or replayed runs (``.name``, ``.steps``, ``.config``, ``.trunk``, ``.fork_step``);
    ``ValueError`` on one the twin cannot train.

    schedules: run name -> its `learning_rates` array, computed beforehand (each costs a JAX
    compile of about a second per distinct run length); missing ones are computed here.
    fork_dir: where trunks save their state for their branches (needed when there are branches).
    """
    from jaxformer.accounting.compute import training_flops
    from jaxformer.train.config import config_from_dict

    forks: dict[str, set[int]] = {}
    for run in planned:
        if run.trunk is not None:
            forks.setdefault(run.trunk, set()).add(int(run.fork_step))
    if forks and fork_dir is None:
        raise ValueError("branched runs need a fork_dir for their trunks' states")
    check_supported(planned)
    runs = []
    for run in planned:
        config = config_from_dict(dict(run.config))
        if config.total_steps != run.steps:
            raise ValueError(f"run {run.name}: planned {run.steps} steps, its config takes {config.total_steps}")
        opt, train = config.optimizer, config.train
        runs.append(TwinRun(
            name=run.name, model=config.model, steps=run.steps, batch_size=train.batch_size, seq_len=train.seq_len,
            grad_accum=train.grad_accum, seed=train.seed,
            learning_rates=_schedule(schedules, run.name, config, run.steps),
            betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay, grad_clip=opt.grad_clip,
            log_interval=config.logging.interval, checkpoint_interval=config.checkpoint.interval,
            eval_tokens=train.eval_tokens, autocast=train.compute_dtype == "bfloat16",
            data_key=json.dumps(run.config.get("data", {}), sort_keys=True),
            # a branch computes only the steps after its fork
            flops_exact=training_flops(config.model, (run.steps - (run.fork_step or 0)) * config.tokens_per_step,
                                       train.seq_len)["exact"],
            checkpoint_dir=checkpoint_dir, checkpoint_max_overhead=getattr(config.checkpoint, "max_overhead", None),
            trunk=run.trunk, fork_step=run.fork_step, forks=tuple(sorted(forks.get(run.name, ()))),
            fork_dir=fork_dir))
    return runs


def _schedule(schedules: dict | None, name: str, config, steps: int) -> np.ndarray:
    given = None if schedules is None else schedules.get(name)
    if given is None:
        return _learning_rates(config, steps)
    if given.shape != (steps,):
        raise ValueError(f"run {name}: the given schedule has {given.shape} learning rates, the run {steps} steps")
    return np.asarray(given, np.float32)


def save_schedules(planned: list, path: str | Path) -> None:
    """Every planned run's `learning_rates` array, to an .npz file for ``--schedules``."""
    from jaxformer.train.config import config_from_dict

    arrays = {run.name: _learning_rates(config_from_dict(dict(run.config)), run.steps) for run in planned}
    np.savez(path, **arrays)


def _learning_rates(config, steps: int) -> np.ndarray:
    """jaxformer's schedule array for a `TrainConfig`, as its training loop computes it."""
    from jaxformer.train.optimizer import learning_rates

    return learning_rates(config.optimizer, steps, config.tokens_per_step)


def prepare_data(planned: list) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``data_key -> (train tokens, validation tokens)``: `prepare_dataset` once per distinct data section."""
    from jaxformer.train.config import config_from_dict
    from jaxformer.train.dataset import check_sizes, prepare_dataset

    datasets, prepared = {}, {}
    for run in planned:
        config = config_from_dict(dict(run.config))
        key = json.dumps(run.config.get("data", {}), sort_keys=True)
        if key not in prepared:
            prepared[key] = prepare_dataset(config)
            datasets[key] = (prepared[key].train, prepared[key].val)
        check_sizes(config, prepared[key])
    return datasets


def train_twin(run: TwinRun, train_tokens: np.ndarray, val_tokens: np.ndarray) -> dict[str, Any]:
    """Trains ``run`` in this process with PyTorch eager; its record (losses, steps, time breakdown)."""
    import torch
    from torch.nn import functional as TF

    from jaxformer.benchmarks.torch_reference import TorchDecoder
    from jaxformer.train.loader import Loader, eval_batches

    started = time.perf_counter()
    torch.manual_seed(run.seed)
    model = TorchDecoder(run.model)
    if run.initial_params is not None:
        model.load_state_dict(torch.load(run.initial_params))
    parameters = list(model.parameters())
    groups = [{"params": [p for p in parameters if p.ndim >= 2], "weight_decay": run.weight_decay},
              {"params": [p for p in parameters if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=float(run.learning_rates[0]), betas=run.betas, eps=run.eps)
    loader = Loader(train_tokens, run.seq_len, run.batch_size, run.seed)
    micro = run.batch_size // run.grad_accum
    val = torch.from_numpy(eval_batches(val_tokens, run.seq_len, micro, run.eval_tokens).astype(np.int64))
    vocab = run.model.vocab_size
    times = dict.fromkeys(("startup_s", "data_s", "train_s", "eval_s", "checkpoint_s"), 0.0)
    times["startup_s"] = time.perf_counter() - started

    def loss_of(windows_BW: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=run.autocast):
            logits = model(windows_BW[:, :-1])
        return TF.cross_entropy(logits.float().reshape(-1, vocab), windows_BW[:, 1:].reshape(-1))

    first = 1
    if run.trunk is not None:  # a branch continues its trunk's model, optimizer and data stream
        mark = time.perf_counter()
        state = torch.load(Path(run.fork_dir) / run.trunk / f"{run.fork_step}.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.position = run.fork_step * run.batch_size
        first = run.fork_step + 1
        times["checkpoint_s"] += time.perf_counter() - mark
    applied, losses, train_loss = [], [], None
    window_sum, window_steps = torch.zeros(()), 0
    for step in range(first, run.steps + 1):
        mark = time.perf_counter()
        batch = torch.from_numpy(loader.next_batch().astype(np.int64)).view(run.grad_accum, micro, run.seq_len + 1)
        now = time.perf_counter()
        times["data_s"] += now - mark
        mark = now
        lr = float(run.learning_rates[step - 1])
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        for windows in batch:
            loss = loss_of(windows) / run.grad_accum
            loss.backward()
            window_sum += loss.detach()
        if run.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(parameters, run.grad_clip)
        if run.record_lrs:
            applied.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        last = step == run.steps
        window_steps += 1
        if step % run.log_interval == 0 or last:  # synchronise and read the loss, as jaxformer's log rows do
            train_loss = float(window_sum) / window_steps
            window_sum, window_steps = torch.zeros(()), 0
            losses.append((step, train_loss))
        times["train_s"] += time.perf_counter() - mark
        over_budget = run.checkpoint_max_overhead is not None and (
            times["checkpoint_s"] > run.checkpoint_max_overhead * times["train_s"])
        due = [run.fork_dir] if step in run.forks else []  # a trunk leaves its state where its branches start
        if run.checkpoint_dir and (last or (step % run.checkpoint_interval == 0 and not over_budget)):
            due.append(run.checkpoint_dir)
        for directory in due:
            mark = time.perf_counter()
            path = Path(directory) / run.name / f"{step}.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)
            times["checkpoint_s"] += time.perf_counter() - mark
    mark = time.perf_counter()
    with torch.no_grad():
        val_loss = float(torch.stack([loss_of(windows) for windows in val]).mean())
    times["eval_s"] = time.perf_counter() - mark
    times["total_s"] = time.perf_counter() - started
    optimizer_steps = {int(state["step"]) for state in optimizer.state.values()}
    record = {"name": run.name, "steps": run.steps, "optimizer_steps": max(optimizer_steps, default=0),
              "fork_step": run.fork_step, "tokens": (run.steps - first + 1) * run.batch_size * run.seq_len, "flops_exact": run.flops_exact,
              "train_loss": train_loss, "val_loss": val_loss, "losses": losses, "time": times,
              "pid": os.getpid()}
    if run.record_lrs:
        record["learning_rates"] = applied
    return record


# --- worker processes: set up once by the pool's initializer; the data arrive as .npy files, loaded once each ---
_DATA: dict[str, tuple[np.ndarray, np.ndarray]] = {}
_WORKER: dict[str, Any] = {}


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    import jaxformer.train.loader  # noqa: F401  (the data loader, imported before the first run)
    from jaxformer.benchmarks.torch_reference import matmul_peak  # and the model

    # the first AdamW of a process imports the rest of torch.optim (seconds): process start-up, not a run's
    weight = torch.nn.Parameter(torch.ones(2, 2))
    warm = torch.optim.AdamW([weight])
    weight.sum().backward()
    warm.step()
    _WORKER.update(ready=time.time(), peak=matmul_peak(repeats=5))


def _train_in_worker(task: tuple[TwinRun, str]) -> dict:
    run, data_dir = task
    if run.data_key not in _DATA:
        index = json.loads((Path(data_dir) / "keys.json").read_text()).index(run.data_key)
        _DATA[run.data_key] = tuple(np.load(Path(data_dir) / f"{index}.{split}.npy") for split in ("train", "val"))
    record = train_twin(run, *_DATA[run.data_key])
    record.update(worker_ready=_WORKER["ready"], worker_peak_flops=_WORKER["peak"])
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
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_init_worker, initargs=(threads,)) as pool, \
            tempfile.TemporaryDirectory(prefix="jaxformer-twin-") as data_dir:
        stages = replay_plan(sweep_dir)
        planned = [run for stage in stages for run in stage]
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
