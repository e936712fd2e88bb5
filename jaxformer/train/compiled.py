"""Compiled programs of a run — initial state, train step, eval pass — kept for every later run of the same
program in this process.

A sweep trains hundreds of short runs, most of them of a shape a worker has trained before;
compiling costs more than training for the smallest. A step's program depends on the model
(its graph, kernel included), the optimizer's settings, the compute dtype, the mesh and rules,
and the batch shapes — not on the seed, the learning rate (an argument of every step) or the
number of steps; the initial state's program takes the seed as an argument, and a run that
restores a checkpoint (a resumed run, a sweep's cooldown branch) needs only its abstract state.
`initial_state` and `compiled_steps` compile each such program once per process; JAX's persistent compilation cache (``train.compilation_cache``) serves other processes and relaunches.
Runs trained together (`jaxformer.train.together`) step Y states stacked on a leading axis
(``stacked``: ``vmap`` or ``map``), placed by `stacked_shardings`: a program per shape, Y and way.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxformer.architecture import ModelConfig
from jaxformer.kernel import KernelConfig
from jaxformer.parallel import Layout
from jaxformer.parallel.layout import jit_once
from jaxformer.runtime import compile_program
from jaxformer.train.optimizer_config import OptimizerConfig, transformation_settings
from jaxformer.train.step import Stacked, build_state, make_eval_pass, make_train_step

_PROGRAMS: dict[tuple, tuple[Callable, Callable]] = {}
_INITS: dict[tuple, tuple[Any, Any, Callable[[int], Any]]] = {}


def _layout_key(layout: Layout) -> tuple:
    return layout.mesh, repr(sorted(layout.rules.items()))


def initial_state(model: ModelConfig, kernel: KernelConfig, optimizer_config: OptimizerConfig,
                  optimizer: optax.GradientTransformation, layout: Layout) -> tuple[Any, Any, Callable[[int], Any]]:
    """``(graphdef, abstract, init)`` of a fresh run on ``layout``: ``abstract`` the state's shapes, dtypes and
    shardings (what a checkpoint restores into, known without compiling anything) and ``init(seed)`` the state,
    created sharded (`Layout.materialize`'s way) by a program compiled once per model, kernel, optimizer and
    layout, on its first call — a run restored from a checkpoint never calls it."""
    key = (model, kernel, transformation_settings(optimizer_config), *_layout_key(layout))
    if key not in _INITS:
        def build(seed):
            return build_state(model, seed, optimizer, kernel)

        graphdef, abstract = jax.eval_shape(build, 0)
        shardings = layout.shardings(abstract)
        # `shardings` holds one sharding where ``abstract`` holds a variable: a prefix of its tree
        abstract = jax.tree.map(lambda s, x: jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(
            leaf.shape, leaf.dtype, sharding=s), x), shardings, abstract)
        program = jit_once(lambda seed: build(seed)[1], out_shardings=shardings)
        _INITS[key] = graphdef, abstract, lambda seed: program(np.int32(seed))
    return _INITS[key]


def stacked_shardings(layout: Layout, state: Any) -> Any:
    """Where Y runs' states stacked on a leading axis live: each run's slice as `Layout.shardings` places one
    run's ``state`` (arrays or ``ShapeDtypeStruct``), the run axis not split."""
    return jax.tree.map(lambda s: NamedSharding(s.mesh, PartitionSpec(None, *s.spec)), layout.shardings(state))


def compiled_steps(graphdef, optimizer_config: OptimizerConfig, optimizer: optax.GradientTransformation,
                   compute_dtype: str, layout: Layout, state: Any, batch: jax.ShapeDtypeStruct,
                   val_batches: jax.Array, *, stacked: Stacked = None) -> tuple[Callable, Callable, bool]:
    """``(train_step, eval_pass, reused)``: the run's compiled steps; ``reused`` when this process had them.

    ``stacked`` (``vmap`` or ``map``): ``state`` and ``batch`` hold Y runs on a leading axis (`make_train_step`'s
    ``stacked``), the state placed by `stacked_shardings`; ``val_batches`` are one set for every run.
    """
    key = (graphdef, transformation_settings(optimizer_config), compute_dtype, *_layout_key(layout),
           batch.shape, batch.sharding, val_batches.shape, val_batches.sharding, stacked,
           jax.tree.structure(state), tuple((x.shape, x.dtype) for x in jax.tree.leaves(state)))
    if key in _PROGRAMS:
        return (*_PROGRAMS[key], True)
    if stacked:
        one_run = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), state)  # keeps logical axes
        state_sharding = stacked_shardings(layout, one_run)
    else:
        state_sharding = layout.shardings(state)
    lr = np.zeros((batch.shape[0],) if stacked else (), np.float32)
    train_step = compile_program(make_train_step(graphdef, optimizer, compute_dtype, state_sharding=state_sharding,
                                                 batch_sharding=batch.sharding, stacked=stacked).lower(state, batch, lr),
                                 loop_free=not stacked and batch.shape[0] == 1)  # one micro-batch
    eval_pass = compile_program(make_eval_pass(graphdef, compute_dtype, params_sharding=state_sharding["params"],
                                               batch_sharding=val_batches.sharding,
                                               stacked=stacked).lower(state["params"], val_batches))
    _PROGRAMS[key] = train_step, eval_pass
    return train_step, eval_pass, False
