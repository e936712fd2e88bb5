"""One run of the PyTorch twin of a sweep (`torch_sweep` runs a whole plan on a pool of processes), for
`jaxformer bench sweep` (PyTorch is a peer, not a dependency).

`train_twin` trains a `TwinRun` (`twin_runs` makes them from planned or replayed runs) in this process,
doing the work jaxformer's run does:

- the same model (`torch_reference.TorchDecoder`: dense pre-norm decoders; other
  architectures are refused in one line naming the field, `unsupported`), drawn as jaxformer
  draws its initial parameters (`torch_reference.init_like_jaxformer`), fp32, or its forward under
  ``torch.autocast`` (bf16) where the run computes in bfloat16 (``train.compute_dtype``), as
  `torch_reference.make_torch_step` times it: fp32 parameters and optimizer, bf16 matmuls;
- ``steps = train.tokens / (batch_size · seq_len)`` optimizer steps of ``grad_accum``
  micro-batches, on the windows jaxformer's `Loader` cuts from the same training split
  (`prepare_data`: `prepare_dataset` once per distinct data section);
- AdamW with the run's betas, eps and weight decay (matrices, not biases, as jaxformer's
  `decay_mask`), global-norm clipping, at the learning rate of jaxformer's own schedule
  array (`jaxformer.train.optimizer.learning_rates`) set before every update. Evaluating
  it costs a JAX compile per distinct run length (about a second each), which a PyTorch
  script would not pay: `jaxformer bench sweep` computes the arrays beforehand
  (`save_schedules`) and hands them over with ``--schedules FILE.npz``;
- a branch starts from its trunk's model, optimizer and data position at its fork step
  (``torch.save`` by the trunk, ``torch.load`` by the branch, both counted as checkpoint time)
  and trains the remaining steps of its own schedule;
- the training loss read at ``logging.interval`` steps and a validation pass over the same
  ``eval_tokens`` windows (`eval_batches`) every ``train.eval_interval`` steps and at the last;
  optionally a ``torch.save`` of model and optimizer at ``checkpoint.interval`` steps, at
  ``checkpoint.steps`` and the last, skipping interval saves past ``checkpoint.max_overhead`` as
  jaxformer does (``--checkpoints DIR``).

Each run's record carries ``time``: ``startup_s`` (model and optimizer), ``data_s`` (batches),
``train_s`` (the updates), ``eval_s``, ``checkpoint_s``, ``total_s``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from jaxformer.architecture import ModelConfig
from jaxformer.benchmarks.twin_model import jaxformer_init_stds, unsupported_model


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
    init_stds: tuple[float, float]  # jaxformer's (weights, residual outputs) init stds (`jaxformer_init_stds`)
    eval_interval: int = 0  # train.eval_interval: steps between validation passes (0: only at the end)
    checkpoint_steps: tuple[int, ...] = ()  # checkpoint.steps: saved whatever the interval and overhead say
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
    if model.init_from is not None:
        return f"model.init_from={model.init_from!r} (the twin starts from jaxformer's initialisation)"
    return unsupported_model(model)


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
            init_stds=jaxformer_init_stds(config.model), eval_interval=train.eval_interval,
            checkpoint_steps=tuple(config.checkpoint.steps),
            data_key=json.dumps(run.config.get("data", {}), sort_keys=True),
            # a branch computes only the steps after its fork
            flops_exact=training_flops(config.model, (run.steps - (run.fork_step or 0)) * config.tokens_per_step,
                                       train.seq_len)["exact"],
            checkpoint_dir=checkpoint_dir, checkpoint_max_overhead=getattr(config.checkpoint, "max_overhead", None),
            trunk=run.trunk, fork_step=run.fork_step, forks=tuple(sorted(forks.get(run.name, ()))),
            fork_dir=fork_dir))
    return runs


SCHEDULE_KEYS = "schedule_keys"  # the entry of a schedules .npz naming what each array was computed for


def _schedule(schedules: dict | None, name: str, config, steps: int) -> np.ndarray:
    given = None if schedules is None else schedules.get(name)
    if given is None:
        return _learning_rates(config, steps)
    keys = json.loads(str(schedules.get(SCHEDULE_KEYS, "{}")))
    if keys.get(name) != schedule_key(config, steps):
        raise ValueError(f"run {name}: the given schedule was computed for another optimizer section or length "
                         f"than the run's ({keys.get(name)} vs {schedule_key(config, steps)})")
    if given.shape != (steps,):
        raise ValueError(f"run {name}: the given schedule has {given.shape} learning rates, the run {steps} steps")
    return np.asarray(given, np.float32)


def schedule_key(config, steps: int) -> str:
    """What a run's `learning_rates` array depends on (its optimizer section, steps and tokens per step), as JSON."""
    return json.dumps({"optimizer": dataclasses.asdict(config.optimizer), "steps": steps,
                       "tokens_per_step": config.tokens_per_step}, sort_keys=True)


def save_schedules(planned: list, path: str | Path) -> None:
    """Every planned run's `learning_rates` array, to an .npz file for ``--schedules``, with the `schedule_key` of
    each (under `SCHEDULE_KEYS`), which `twin_runs` checks against the run it trains."""
    from jaxformer.train.config import config_from_dict

    configs = {run.name: (config_from_dict(dict(run.config)), run.steps) for run in planned}
    arrays = {name: _learning_rates(config, steps) for name, (config, steps) in configs.items()}
    keys = {name: schedule_key(config, steps) for name, (config, steps) in configs.items()}
    np.savez(path, **arrays, **{SCHEDULE_KEYS: np.array(json.dumps(keys))})


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

    from jaxformer.benchmarks.torch_reference import TorchDecoder, adamw, init_like_jaxformer
    from jaxformer.train.loader import Loader, eval_batches

    started = time.perf_counter()
    torch.manual_seed(run.seed)
    model = TorchDecoder(run.model)
    if run.initial_params is not None:
        model.load_state_dict(torch.load(run.initial_params))
    else:
        init_like_jaxformer(model, run.init_stds)
    parameters = list(model.parameters())
    optimizer = adamw(model, lr=float(run.learning_rates[0]), betas=run.betas, eps=run.eps,
                      weight_decay=run.weight_decay)
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

    def validation_loss() -> float:
        with torch.no_grad():
            return float(torch.stack([loss_of(windows) for windows in val]).mean())

    first = 1
    if run.trunk is not None:  # a branch continues its trunk's model, optimizer and data stream
        mark = time.perf_counter()
        state = torch.load(Path(run.fork_dir) / run.trunk / f"{run.fork_step}.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.position = run.fork_step * run.batch_size
        first = run.fork_step + 1
        times["checkpoint_s"] += time.perf_counter() - mark
    applied, losses, val_losses, train_loss = [], [], [], None
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
        if last or (run.eval_interval and step % run.eval_interval == 0):  # as jaxformer's loop evaluates
            mark = time.perf_counter()
            val_losses.append((step, validation_loss()))
            times["eval_s"] += time.perf_counter() - mark
        over_budget = run.checkpoint_max_overhead is not None and (
            times["checkpoint_s"] > run.checkpoint_max_overhead * times["train_s"])
        due = [run.fork_dir] if step in run.forks else []  # a trunk leaves its state where its branches start
        if run.checkpoint_dir and (last or step in run.checkpoint_steps
                                   or (step % run.checkpoint_interval == 0 and not over_budget)):
            due.append(run.checkpoint_dir)
        for directory in due:
            mark = time.perf_counter()
            path = Path(directory) / run.name / f"{step}.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)
            times["checkpoint_s"] += time.perf_counter() - mark
    times["total_s"] = time.perf_counter() - started
    optimizer_steps = {int(state["step"]) for state in optimizer.state.values()}
    record = {"name": run.name, "steps": run.steps, "optimizer_steps": max(optimizer_steps, default=0),
              "fork_step": run.fork_step, "tokens": (run.steps - first + 1) * run.batch_size * run.seq_len, "flops_exact": run.flops_exact,
              "train_loss": train_loss, "val_loss": val_losses[-1][1] if val_losses else None,
              "val_losses": val_losses, "losses": losses, "time": times, "autocast": run.autocast,
              "pid": os.getpid()}
    if run.record_lrs:
        record["learning_rates"] = applied
    return record
