"""`train(config, run_dir)`: one run from a validated config to ``final.json``.

Order of work: every check that can fail on user input (config, resume compatibility,
corpus, sizes, the checkpoints' model) runs before anything is written to the run directory, which then
gets its first files (`jaxformer.train.prepare`); the model is initialised, or restored from the latest
readable checkpoint (resume is the default); the loop runs with host synchronisation only at log,
evaluation and checkpoint steps; ``final.json`` is the record sweeps and fits read. Run directory:
``config.yaml data.json [tokenizer.json …] checkpoints/ metrics.jsonl tensorboard/ final.json`` (or only
``error.json`` when the input was bad).

Devices: the state lives on the mesh of ``parallel`` (`jaxformer.parallel.Layout`;
data-parallel over every device by default, and the `jaxformer` command makes each CPU
core a device), created sharded and stepped by a step compiled for that
layout. In a multi-process run every process runs this loop on its own slice of each
batch; process 0 alone writes the run files, metrics and ``final.json``, and every
process writes its shards of each checkpoint.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import numpy as np

from jaxformer.accounting import count_params, training_flops, training_flops_per_token
from jaxformer.parallel import Layout
from jaxformer.parallel.distributed import from_process_0
from jaxformer.runtime import enable_compilation_cache, process_startup_s
from jaxformer.files import write_json_atomic
from jaxformer.train.checkpoint import Checkpointer
from jaxformer.train.config import TrainConfig, config_to_dict
from jaxformer.train.dataset import Dataset
from jaxformer.train.from_checkpoint import checkpoint_params
from jaxformer.train.loader import Loader, eval_batches
from jaxformer.train.compiled import compiled_steps, initial_state
from jaxformer.train.kernel_choice import KernelChoice
from jaxformer.train.late_reports import failed_write_tracebacks_ignored, reads_outliving_their_loop_ignored
from jaxformer.train.matmul_choice import MatmulChoice, choose_kernels
from jaxformer.train.metrics import MetricsLogger, last_logged
from jaxformer.train.optimizer import learning_rates, make_optimizer
from jaxformer.train.peak import machine_peak_flops
from jaxformer.train.prepare import begin_run, prepare_run
from jaxformer.train.run_claim import claimed
from jaxformer.train.step import empty_sums


class NonFiniteLoss(RuntimeError):
    """The loss or gradient norm became NaN or infinite; the last good checkpoint is kept."""


class RunWriteError(OSError):
    """An ``OSError`` met once a checked run directory is being written (`written_runs`): the machine's (a disk
    that fills or turns read-only, a file refused midway), not the input's, whatever its errno."""


@contextlib.contextmanager
def written_runs() -> Iterator[None]:
    """Raises an ``OSError`` from inside as a `RunWriteError` (same errno, message and file)."""
    try:
        yield
    except RunWriteError:
        raise
    except OSError as error:
        arguments = (error.errno, error.strerror, error.filename) if error.errno is not None else error.args
        raise RunWriteError(*arguments) from error


@reads_outliving_their_loop_ignored()  # a failed restore's late reports, the caller's hooks as they were after
@failed_write_tracebacks_ignored()  # Orbax's of a failed write (raised in one line), absl's filters as they were
def train(config: TrainConfig, run_dir: Path) -> dict:
    """Trains (or resumes) the run in ``run_dir`` (claimed: `jaxformer.train.run_claim`); returns ``final.json``."""
    started, times, run_dir = time.perf_counter(), {"startup_s": process_startup_s()}, Path(run_dir)
    with claimed(run_dir, config.parallel.distributed):
        layout, dataset, final = prepare_run(config, run_dir)
        times["data_s"] = time.perf_counter() - started
        if final is not None:  # a finished run: nothing left to do
            return final
        # --- all input checks passed: from here on the run directory is written ---
        begin_run(config, run_dir, dataset)  # a run directory the user may not write fails here: bad input
        with written_runs():
            enable_compilation_cache(config.train.compilation_cache)
            config, kernel_choice, matmul_choice = choose_kernels(config)  # `auto`: timed here, or read from the cache
            times["kernel_choice_s"] = kernel_choice.seconds + matmul_choice.seconds
            return RunSegment(config, run_dir, dataset, layout, started, times, kernel_choice, matmul_choice).run()


def due_at(config: TrainConfig, step: int, over_budget: Callable[[], bool]) -> tuple[bool, bool, bool]:
    """``(log, evaluate, save)`` at ``step`` of a run of ``config``: a train-loss row, a validation pass, a checkpoint;
    ``over_budget()``, asked only at an interval save, whether saving has cost past ``checkpoint.max_overhead``."""
    last = step == config.total_steps
    log = step % config.logging.interval == 0 or last
    evaluate = bool(config.train.eval_interval and step % config.train.eval_interval == 0) or last
    save = last or step in config.checkpoint.steps or (step % config.checkpoint.interval == 0 and not over_budget())
    return log, evaluate, save


class _Silent:
    """The metrics logger of processes other than 0: process 0 reports for the whole run."""

    def advance(self, steps: int = 1) -> None:
        pass

    def log(self, row: dict) -> None:
        pass

    def close(self) -> None:
        pass


class RunSegment:
    """The state of one training process (one segment of a possibly resumed run), trained alone by `run`; runs
    trained together (`jaxformer.train.together`) each keep one for their files, loader, schedule and rows
    (`open` … `final_record`), sharing one ``times`` dict: the seconds of the one program they all ran."""

    def __init__(self, config: TrainConfig, run_dir: Path, dataset: Dataset, layout: Layout, started: float,
                 times: dict[str, float], kernel_choice: KernelChoice, matmul_choice: MatmulChoice) -> None:
        self.config, self.run_dir, self.dataset, self.layout, self.started = config, run_dir, dataset, layout, started
        self.kernel_choice, self.matmul_choice = kernel_choice, matmul_choice
        # where this segment's seconds go (``final.json["time"]``); data_s counts from the call of `train`
        self.times = times
        times.update(init_s=0.0, restore_s=0.0, compile_s=0.0, train_s=0.0, eval_s=0.0, checkpoint_s=0.0)
        train = config.train
        self.total_steps = config.total_steps
        self.tokens_per_step = config.tokens_per_step
        self.learning_rates = learning_rates(config.optimizer, self.total_steps, self.tokens_per_step)
        self.optimizer = make_optimizer(config.optimizer)
        self.flops_per_token = training_flops_per_token(config.model, train.seq_len, "exact")
        self.loader = Loader(dataset.train, train.seq_len, train.batch_size, train.seed)
        self.micro_batch = config.micro_batch
        # this process feeds the rows its devices hold, of every micro-batch
        self.batch_shape = (train.grad_accum, self.micro_batch, train.seq_len + 1)
        self.batch_sharding = layout.batch_sharding(self.batch_shape, batch_dim=1)
        rows = layout.process_rows(self.batch_sharding, self.batch_shape, batch_dim=1)
        self.loader_rows = (np.arange(train.grad_accum)[:, None] * self.micro_batch + np.asarray(rows)).reshape(-1)
        val = eval_batches(dataset.val, train.seq_len, self.micro_batch, train.eval_tokens)
        self.val_tokens_per_byte = dataset.scored_tokens_per_byte(val[..., 1:])  # of the tokens scored
        self.val_sharding = layout.batch_sharding(val.shape, batch_dim=1)
        rows = layout.process_rows(self.val_sharding, val.shape, batch_dim=1)
        self.val_batches = layout.global_array(val[:, rows.start:rows.stop], self.val_sharding, val.shape)

    def run(self) -> dict:
        config, layout = self.config, self.layout
        graphdef, abstract, init = self.timed("init_s", lambda: initial_state(
            config.model, config.kernel, config.optimizer, self.optimizer, layout))
        state = self.open(abstract, lambda: init(config.train.seed))
        example = jax.ShapeDtypeStruct(self.batch_shape, np.int32, sharding=self.batch_sharding)
        compile_start = time.perf_counter()
        train_step, eval_pass, self.reused_program = compiled_steps(
            graphdef, config.optimizer, self.optimizer, config.train.compute_dtype, layout, state, example,
            self.val_batches)
        self.times["compile_s"] = time.perf_counter() - compile_start
        self.mark = time.perf_counter()
        try:
            for step in range(self.start_step + 1, self.total_steps + 1):
                local = self.loader.next_batch(self.loader_rows).reshape(self.batch_shape[0], -1, self.batch_shape[2])
                batch = self.layout.global_array(local, self.batch_sharding, self.batch_shape)
                state = train_step(state, batch, self.learning_rates[step - 1])
                self.logger.advance()
                state = self._maybe_report(step, state, eval_pass)
            if self.val_loss is None:  # resumed at the very end: evaluate the restored parameters
                self.val_loss = self.timed("eval_s", lambda: float(eval_pass(state["params"], self.val_batches)))
        finally:
            self.close()
        record = self.final_record()
        if jax.process_index() == 0:
            write_json_atomic(self.run_dir / "final.json", record)
        return record

    def open(self, abstract, fresh: Callable[[], Any]):
        """The run's state: restored into ``abstract`` (shapes, dtypes, shardings) from its latest readable
        checkpoint, else ``fresh()`` (a new state, timed as ``init_s``: its program compiles on a new shape),
        with the parameters of ``model.init_from`` when set; opens the run's checkpointer and metrics logger
        (`close` closes them)."""
        config, run_dir = self.config, self.run_dir
        mark = time.perf_counter()
        self.checkpointer = Checkpointer(run_dir / "checkpoints", config.checkpoint.keep,
                                         kept_steps=config.checkpoint.steps, asynchronous=config.checkpoint.asynchronous)
        # prepare_run refused another model's steps before writing anything; the claimed directory gains none since
        restored = self.checkpointer.restore_latest(abstract, model_checked=True)
        self.times["restore_s"] += time.perf_counter() - mark
        self.previous_wall_s, self.resumed_from = 0.0, None
        if restored is None:
            state = self.timed("init_s", fresh)
            if config.model.init_from:
                state = {**state, "params": checkpoint_params(config.model, abstract["params"])}
        else:
            step, state, meta = restored
            self.loader.load_state_dict(meta["loader"])
            self.previous_wall_s = float(meta["wall_s"])
            self.resumed_from = {"step": step, "checkpoint": str(self.checkpointer.directory / str(step))}
            if jax.process_index() == 0:
                print(f"resumed from step {step} (checkpoint {self.resumed_from['checkpoint']})", file=sys.stderr,
                      flush=True)
        start_step = self.start_step = int(state["step"])
        self.peak_flops = config.train.peak_flops or machine_peak_flops(config.train.compute_dtype,
                                                                        impl=config.kernel.matmul_impl)
        self.logger = _Silent()
        if jax.process_index() == 0:
            self.logger = MetricsLogger(run_dir, start_step=start_step, total_steps=self.total_steps,
                                        progress=config.logging.progress, tensorboard=config.logging.tensorboard)
        self.last_train_loss = last_logged(run_dir / "metrics.jsonl", "train_loss")
        self.val_loss = None
        self.logged = (start_step, 0.0)  # (step, training seconds) at the last train-loss row
        return state

    def close(self) -> None:
        self.logger.close()
        self.timed("checkpoint_s", self.checkpointer.close)  # an asynchronous save's write ends here

    def _maybe_report(self, step, state, eval_pass):
        """At log, eval and checkpoint steps: synchronise, check the loss, write rows and checkpoints."""
        log, evaluate, save = self.due(step)
        if not (log or evaluate or save):
            return state
        host = jax.device_get({"sums": state["sums"], "first_nonfinite": state["first_nonfinite"]})
        self.times["train_s"] += time.perf_counter() - self.mark
        self.check_finite(int(host["first_nonfinite"]))
        if log:
            state = {**state, "sums": jax.device_put(empty_sums(), self.layout.replicated)}
        val_loss = None
        if evaluate:
            val_loss = self.timed("eval_s", lambda: float(eval_pass(state["params"], self.val_batches)))
        if log or evaluate:  # a step that only saves writes no row (metrics.jsonl holds log and eval steps)
            self.logger.log(self.row(step, host["sums"] if log else None, val_loss))
        if save:
            self.save(step, state)
        self.mark = time.perf_counter()
        return state

    def due(self, step: int) -> tuple[bool, bool, bool]:
        """`due_at` of this run, saving's cost judged by `_saving_over_budget`."""
        return due_at(self.config, step, self._saving_over_budget)

    def check_finite(self, first_nonfinite: int) -> None:
        """Raises `NonFiniteLoss` when the state has recorded a first non-finite step (``first_nonfinite ≥ 0``)."""
        if first_nonfinite >= 0:
            saved = self.checkpointer.steps()
            kept = f"the last good checkpoint is step {saved[-1]}" if saved else "no checkpoint was saved yet"
            raise NonFiniteLoss(
                f"non-finite loss, gradient or parameters at step {first_nonfinite} "
                f"(optimizer.lr={self.config.optimizer.lr}); {kept} in {self.run_dir / 'checkpoints'}"
            )

    def row(self, step: int, sums: dict | None, val_loss: float | None) -> dict:
        """The metrics row of ``step`` from the host copy of the state's ``sums`` since the last row (None: no
        train loss at this step) and ``val_loss`` (None: no evaluation); rates use ``times["train_s"]``."""
        row = {"step": step, "tokens": step * self.tokens_per_step}
        if sums is not None:
            count = int(sums["count"])
            self.last_train_loss = float(sums["loss"]) / count
            steps_done, seconds = step - self.logged[0], self.times["train_s"] - self.logged[1]
            tokens_per_s = steps_done * self.tokens_per_step / seconds if seconds > 0 else None
            row.update(train_loss=self.last_train_loss, grad_norm=float(sums["grad_norm"]) / count,
                       lr=float(self.learning_rates[step - 1]), tokens_per_s=tokens_per_s,
                       mfu=self.mfu(tokens_per_s))
            self.logged = (step, self.times["train_s"])
        if val_loss is not None:
            self.val_loss = val_loss
            row.update(val_loss=val_loss, val_bits_per_byte=self.dataset.bits_per_byte(val_loss, self.val_tokens_per_byte))
        row["wall_s"] = self._wall_s()
        return row

    def mfu(self, tokens_per_s: float | None) -> float | None:
        """MFU at ``tokens_per_s`` (exact FLOPs); a rate above the machine's cached peak has it probed again."""
        achieved = (tokens_per_s or 0.0) * self.flops_per_token
        if achieved > self.peak_flops and not self.config.train.peak_flops:
            self.peak_flops = machine_peak_flops(self.config.train.compute_dtype, impl=self.config.kernel.matmul_impl,
                                                 at_least=achieved)
        return achieved / self.peak_flops if tokens_per_s else None

    def save(self, step: int, state) -> None:
        """Checkpoints this run's ``state`` at ``step`` with the loader's position and the wall time so far."""
        meta = {"loader": self.loader.state_dict(), "wall_s": self._wall_s()}
        self.timed("checkpoint_s", lambda: self.checkpointer.save(step, state, meta))

    def _saving_over_budget(self) -> bool:
        """Whether saving has cost more than ``checkpoint.max_overhead`` of the training time so far (process 0's
        clock deciding for all processes: a save that only some of them begin would wait forever)."""
        budget = self.config.checkpoint.max_overhead
        return budget is not None and bool(from_process_0(
            "checkpoint-over-budget", self.times["checkpoint_s"] > budget * self.times["train_s"]))

    def timed(self, what: str, work: Callable[[], Any]) -> Any:
        """``work()``, its seconds added to ``times[what]`` (also when it raises)."""
        start = time.perf_counter()
        try:
            return work()
        finally:
            self.times[what] += time.perf_counter() - start

    def _wall_s(self) -> float:
        return self.previous_wall_s + time.perf_counter() - self.started

    def final_record(self) -> dict:
        cfg, counts = self.config, count_params(self.config.model)
        tokens = self.total_steps * self.tokens_per_step
        flops = training_flops(cfg.model, tokens, cfg.train.seq_len)
        segment_tokens = (self.total_steps - self.start_step) * self.tokens_per_step
        train_s = self.times["train_s"]
        tokens_per_s = segment_tokens / train_s if train_s > 0 else None
        times = {**self.times, "total_s": time.perf_counter() - self.started}
        return {
            "params": counts.total,
            "params_non_embedding": counts.non_embedding,
            "params_active": counts.active,
            "tokens": tokens,
            "tokens_requested": cfg.train.tokens,
            "steps": self.total_steps,
            "batch_size": cfg.train.batch_size,
            "seq_len": cfg.train.seq_len,
            "flops_6nd": flops["6ND"],
            "flops_6nd_non_embedding": flops["6ND_non_embedding"],
            "flops_exact": flops["exact"],
            "epochs": tokens / len(self.dataset.train),  # passes over the training split
            "train_loss": self.last_train_loss,
            "val_loss": self.val_loss,
            "val_bits_per_byte": self.dataset.bits_per_byte(self.val_loss, self.val_tokens_per_byte),
            "wall_s": self._wall_s(),
            "compile_s": self.times["compile_s"],
            "time": {**times, "other_s": times["total_s"] - sum(v for k, v in times.items()
                                                                  if k not in ("total_s", "startup_s"))},
            "compiled": "reused in this process" if self.reused_program else "compiled or loaded from the cache",
            "resumed_from": self.resumed_from,
            "mesh": dict(self.layout.mesh.shape),
            "kernel_choice": self.kernel_choice.to_record(),
            "matmul_choice": self.matmul_choice.to_record(),
            "tokens_per_s": tokens_per_s,
            "mfu": self.mfu(tokens_per_s),
            "peak_flops": self.peak_flops,
            "data": self.dataset.info,
            "config": config_to_dict(cfg),
        }
