"""`train_together(configs, run_dirs)`: Y runs of one shape trained as one compiled program.

Runs whose configs differ only in their learning-rate schedule (`FREE`: ``optimizer.lr`` and
the schedule's settings) and ``train.seed`` take the same steps on the same shapes — a tuning
stage's learning rates at one size, a budget's seeds. Their states are stacked on a leading run
axis Y and stepped by `make_train_step`'s own step applied over that axis: one program, one
dispatch per step for all Y, each run with its own windows ``[Y, A, B, W]`` (its seed's
stream) and its own learning rate ``lr[Y]`` (its schedule, evaluated on the host). How the step
goes over the axis (`jaxformer.train.step.over_runs`) is measured, not assumed
(`jaxformer bench together`, figures in docs/sweep-speed.md): ``vmap`` batches the runs into one
computation, whose batched matmuls XLA:CPU ran slower than lone steps beyond the smallest models;
``map`` (``jax.lax.map``) runs them one after another inside the program, saving the per-step
dispatch. So `default_stacking` is ``map`` on a CPU, and ``vmap`` on accelerators, where batching
small models is what fills the device.

Each run keeps its own directory exactly as `jaxformer.train.loop.train` writes it —
config.yaml, data.json, metrics.jsonl, checkpoints of its own slice of the state (so a lone
`train` resumes it), final.json (plus ``trained_with``: the other runs of the program, and
``trained_as``: ``vmap`` or ``map``) — through the loop's own `RunSegment` bookkeeping. The runs
share one ``time`` breakdown, the seconds of the program they all ran, so each run's
``tokens_per_s`` is its own tokens over the shared time.

A non-finite loss fails its run alone: the error a lone run raises is returned for it (its
last good checkpoint kept), its rows and checkpoints stop, and the others go on. Its slot
keeps being computed: dropping it would compile a program for Y − 1 runs, which costs more
than the slot for the short runs that train together (runs are independent either way, so
its NaNs reach no other run).

Resume: when every unfinished run's newest checkpoint is at the same step (or none has one)
they are restored, each from its own directory, and stacked; otherwise, or when fewer than two
are unfinished, the unfinished ones train alone, one after another, with `train`. A run none of
whose checkpoints reads fails with `CheckpointError`, as it would alone, and the others are
restored and stacked again without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.architecture import DERIVED_FIELDS
from jaxformer.files import write_json_atomic
from jaxformer.runtime import enable_compilation_cache, process_startup_s
from jaxformer.train.checkpoint import CheckpointError
from jaxformer.train.checkpoint_config import latest_saved_step
from jaxformer.train.compiled import compiled_steps, initial_state, stacked_shardings
from jaxformer.train.config import TrainConfig, flatten_dotted, config_to_dict
from jaxformer.train.late_reports import failed_write_tracebacks_ignored, reads_outliving_their_loop_ignored
from jaxformer.train.matmul_choice import choose_kernels
from jaxformer.train.loop import NonFiniteLoss, RunSegment, train, written_runs
from jaxformer.train.prepare import begin_run, prepare_run
from jaxformer.train.run_claim import claimed
from jaxformer.train.step import Stacked, empty_sums

# the fields runs trained together may differ in: the schedule is evaluated on the host, the seed picks the stream
FREE = ("optimizer.lr", "optimizer.schedule", "optimizer.warmup_fraction", "optimizer.warmup_tokens",
        "optimizer.final_lr_fraction", "optimizer.cooldown_fraction", "optimizer.cooldown_shape",
        "train.seed", "train.run_dir")

Result = dict | NonFiniteLoss | CheckpointError


def shared_settings(config: TrainConfig) -> dict:
    """The flattened config without `FREE`: runs with equal shared settings can train together."""
    return {key: value for key, value in flatten_dotted(config_to_dict(config)).items() if key not in FREE}


def together_conflict(configs: Sequence[TrainConfig], names: Sequence[str] | None = None) -> str | None:
    """Why ``configs`` cannot train as one program (one line naming the field and both values); None when they can."""
    names = list(names) if names is not None else [f"run {i}" for i in range(len(configs))]
    if len(configs) < 2:
        return f"training together needs two runs or more, got {len(configs)}"
    if jax.process_count() > 1:
        return f"runs train together in one process only, not across {jax.process_count()} processes"
    first, derived = shared_settings(configs[0]), {f"model.{name}" for name in DERIVED_FIELDS}
    for name, config in zip(names[1:], configs[1:]):
        other = shared_settings(config)
        # fields the model derives from others (d_ff from d_model…) last: the line names the field that was set
        for key in sorted(first.keys() | other.keys(), key=lambda key: (key in derived, key)):
            if first.get(key) != other.get(key):
                return (f"{names[0]} and {name} cannot train together: {key} is {first.get(key)!r} in one and "
                        f"{other.get(key)!r} in the other (only the learning-rate schedule and train.seed may differ)")
    return None


def together_groups(configs: Mapping[str, TrainConfig]) -> list[tuple[str, ...]]:
    """``configs``' names partitioned into groups that can train together (one name: a run with no partner),
    in the order of each group's first run."""
    groups: dict[str, list[str]] = {}
    for name, config in configs.items():
        groups.setdefault(json.dumps(shared_settings(config), sort_keys=True, default=str), []).append(name)
    return [tuple(names) for names in groups.values()]


def default_stacking() -> Stacked:
    """How runs trained together step (module docstring): ``map`` on a CPU, ``vmap`` on an accelerator."""
    return "map" if jax.default_backend() == "cpu" else "vmap"


def _xla_matmul(config: TrainConfig) -> TrainConfig:
    return dataclasses.replace(config, kernel=dataclasses.replace(config.kernel, matmul_impl="xla"))


@reads_outliving_their_loop_ignored()  # as `train`
@failed_write_tracebacks_ignored()
def train_together(configs: Sequence[TrainConfig], run_dirs: Sequence[Path], *,
                   stacked: Stacked = None) -> list[Result]:
    """Trains (or resumes) each run ``configs[i]`` in ``run_dirs[i]``, together where they can (module docstring),
    the step applied over the runs by ``stacked`` (``vmap`` or ``map``; None: `default_stacking`).

    Returns per run its ``final.json`` record, or the `NonFiniteLoss` / `CheckpointError` that failed it
    alone (no error.json is written here: `jaxformer.train.attempt` does, as for a lone run). Configs that
    cannot train together (`together_conflict`) or a bad input in any run raise ``ValueError`` before
    anything is written into the run directories (a missing one is created, empty, to be claimed).
    """
    started = time.perf_counter()
    times = {"startup_s": process_startup_s()}
    run_dirs = [Path(run_dir) for run_dir in run_dirs]
    if len(configs) != len(run_dirs):
        raise ValueError(f"train_together: {len(configs)} configs for {len(run_dirs)} run directories")
    conflict = together_conflict(configs, [run_dir.name for run_dir in run_dirs])
    if conflict:
        raise ValueError(conflict)
    with contextlib.ExitStack() as claims:  # each directory held from before its state is read (`run_claim`)
        for config, run_dir in zip(configs, run_dirs):
            claims.enter_context(claimed(run_dir, config.parallel.distributed))
        return _train_claimed(configs, run_dirs, stacked, started, times)


def _train_claimed(configs: Sequence[TrainConfig], run_dirs: list[Path], stacked: Stacked, started: float,
                   times: dict) -> list[Result]:
    prepared = [prepare_run(config, run_dir, runs=len(configs)) for config, run_dir in zip(configs, run_dirs)]
    times["data_s"] = time.perf_counter() - started
    results: list[Result | None] = [final for _, _, final in prepared]
    todo = [i for i, result in enumerate(results) if result is None]
    while len(todo) >= 2 and len({latest_saved_step(run_dirs[i]) for i in todo}) == 1:
        # --- all input checks passed: from here on the run directories are written ---
        for i in todo:
            begin_run(configs[i], run_dirs[i], prepared[i][1])
        with written_runs():
            enable_compilation_cache(configs[0].train.compilation_cache)
            # `auto`: one measurement, then the machine's cache
            chosen = [choose_kernels(configs[i]) for i in todo]
            stacking = stacked or default_stacking()
            # vmapped runs multiply with XLA: a vmapped oneDNN call (its weights mapped) takes the runs one after
            # another, which no matmul choice timed
            if stacking == "vmap":
                chosen = [(_xla_matmul(config), attention,
                           dataclasses.replace(matmul, matmul_impl="xla", reason="runs trained together by vmap"))
                          if config.kernel.matmul_impl == "onednn" else (config, attention, matmul)
                          for config, attention, matmul in chosen]
            times["kernel_choice_s"] = sum(attention.seconds + matmul.seconds for _, attention, matmul in chosen)
            runs = [RunSegment(config, run_dirs[i], prepared[i][1], prepared[i][0], started, times, attention, matmul)
                    for i, (config, attention, matmul) in zip(todo, chosen)]
            grouped = _Together(runs, stacking)
            together = grouped.run()
            for i, result in zip(todo, together or grouped.results):
                results[i] = result
            if together is not None:
                return results
        remaining = [i for i in todo if results[i] is None]
        if len(remaining) == len(todo):  # none failed: their restored steps differ
            break
        todo = remaining  # a run whose checkpoints all failed to read is out: the others, together again
    for i in todo:  # one at a time, each from its own checkpoints
        results[i] = _alone(configs[i], run_dirs[i])
    return results


def _alone(config: TrainConfig, run_dir: Path) -> Result:
    try:
        return train(config, run_dir)
    except (NonFiniteLoss, CheckpointError) as error:
        return error


def _slice(tree, i: int):
    return jax.tree.map(lambda x: x[i], tree)


class _Together:
    """Y `RunSegment` s stepped as one program; they share one ``times`` dict."""

    def __init__(self, runs: list[RunSegment], stacked: Stacked) -> None:
        self.runs, self.lead, self.stacked = runs, runs[0], stacked
        self.times, self.layout = self.lead.times, self.lead.layout
        self.live = list(range(len(runs)))  # the runs still recorded
        self.results: list[Result | None] = [None] * len(runs)

    def run(self) -> list[Result] | None:
        """Every run's result; None when a run none of whose checkpoints reads failed (its `CheckpointError`, as
        it would alone, in ``self.results``: the others are grouped again) or when the restored steps differ (a
        corrupt checkpoint fell back: the runs train alone)."""
        runs, lead, layout = self.runs, self.lead, self.layout
        programs = [lead.timed("init_s", lambda: initial_state(run.config.model, run.config.kernel,
                                                                run.config.optimizer, run.optimizer, layout))
                    for run in runs]
        graphdef = programs[0][0]
        states = []
        for i, (run, (_, abstract, init)) in enumerate(zip(runs, programs)):
            try:
                states.append(run.open(abstract, lambda: init(run.config.train.seed)))
            except CheckpointError as error:  # its steps are set aside now: trained again, it would begin at step 0
                run.checkpointer.close()
                self.results[i] = error
        if len(states) < len(runs) or len({run.start_step for run in runs}) > 1:
            for run, result in zip(runs, self.results):
                if result is None:
                    run.close()
            return None
        sharding = stacked_shardings(layout, states[0])
        state = jax.device_put(jax.tree.map(lambda *leaves: jnp.stack(leaves), *states), sharding)
        del states
        count = len(runs)
        self.batch_shape = (count, *lead.batch_shape)
        self.batch_sharding = layout.batch_sharding(self.batch_shape, batch_dim=2)
        example = jax.ShapeDtypeStruct(self.batch_shape, np.int32, sharding=self.batch_sharding)
        compile_start = time.perf_counter()
        train_step, eval_pass, reused = compiled_steps(
            graphdef, lead.config.optimizer, lead.optimizer, lead.config.train.compute_dtype, layout, state, example,
            lead.val_batches, stacked=self.stacked)
        self.times["compile_s"] = time.perf_counter() - compile_start
        for run in runs:
            run.reused_program = reused
        # host zeros: each reset puts fresh device arrays, as the state they join is donated to the next step
        self.empty_sums = jax.tree.map(lambda x: np.zeros((count, *x.shape), x.dtype), empty_sums())
        learning_rates = np.stack([run.learning_rates for run in runs], axis=1)  # [steps, Y]
        self.mark = time.perf_counter()
        try:
            for step in range(lead.start_step + 1, lead.total_steps + 1):
                local = np.stack([run.loader.next_batch(run.loader_rows).reshape(lead.batch_shape[0], -1,
                                                                                  lead.batch_shape[2])
                                  for run in runs])
                batch = layout.global_array(local, self.batch_sharding, self.batch_shape)
                state = train_step(state, batch, learning_rates[step - 1])
                for i in self.live:
                    runs[i].logger.advance()
                state = self._maybe_report(step, state, eval_pass)
                if not self.live:
                    break
            if any(runs[i].val_loss is None for i in self.live):  # resumed at the very end
                losses = self._evaluate(eval_pass, state)
                for i in self.live:
                    runs[i].val_loss = float(losses[i])
        finally:
            for i in self.live:
                runs[i].close()
        names = [run.run_dir.name for run in runs]
        for i in self.live:
            record = {**runs[i].final_record(), "trained_with": names[:i] + names[i + 1:],
                      "trained_as": self.stacked}
            write_json_atomic(runs[i].run_dir / "final.json", record)
            self.results[i] = record
        return self.results

    def _evaluate(self, eval_pass, state) -> np.ndarray:
        """``[Y]`` validation losses of every run's parameters, timed as ``eval_s``."""
        return self.lead.timed("eval_s", lambda: np.asarray(jax.device_get(
            eval_pass(state["params"], self.lead.val_batches))))

    def _maybe_report(self, step: int, state, eval_pass):
        """`RunSegment._maybe_report` for all runs at once: one synchronisation, then each live run's row and
        checkpoint."""
        runs = self.runs
        log, evaluate, save = self.lead.due(step)  # the runs share every setting it reads, and the times
        if not (log or evaluate or save):
            return state
        host = jax.device_get({"sums": state["sums"], "first_nonfinite": state["first_nonfinite"]})
        self.times["train_s"] += time.perf_counter() - self.mark
        for i in list(self.live):
            try:
                runs[i].check_finite(int(host["first_nonfinite"][i]))
            except NonFiniteLoss as error:  # this run alone stops; its slot is computed but no longer recorded
                print(f"{runs[i].run_dir.name}: {error}", file=sys.stderr, flush=True)
                self.results[i] = error
                self.live.remove(i)
                runs[i].close()
        if not self.live:
            return state
        if log:
            state = {**state, "sums": jax.device_put(self.empty_sums, self.layout.replicated)}
        losses = self._evaluate(eval_pass, state) if evaluate else None
        for i in self.live if log or evaluate else ():  # as a lone run: no row at a step that only saves
            runs[i].logger.log(runs[i].row(step, _slice(host["sums"], i) if log else None,
                                           None if losses is None else float(losses[i])))
        if save:
            for i in self.live:
                runs[i].save(step, _slice(state, i))
        self.mark = time.perf_counter()
        return state
