"""Creating parameters: one helper, so every parameter carries its logical axis names.

Every weight is an ``nnx.Param`` whose ``out_sharding`` metadata holds one logical
axis name per dimension (one of `AXIS_NAMES`, or None). The names say what a dimension
*is*; which mesh axis it lands on is decided elsewhere (the sharding rules table,
`jaxformer.parallel.rules`, which has a rule for each of these names), so this code
never sees a mesh. ``eager_sharding=False`` keeps construction free of any mesh
context: placement happens when the caller shards the state (e.g. ``jax.jit`` with
``out_shardings`` built from :func:`jaxformer.models.pure.logical_axes`).

Initialisation follows GPT-2: weights ~ N(0, 0.02²), residual-output projections
scaled by ``1/sqrt(2·layers)`` (the layers of their own stack: an encoder–decoder's encoder
its own depth), biases 0, norm scales 1.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

AXIS_NAMES = ("vocab", "embed", "heads", "kv_heads", "head_dim", "mlp", "experts", "norm", "position")
INIT_STD = 0.02


def _param(value: jax.Array, axes: Sequence[str | None]) -> nnx.Param:
    axes = tuple(axes)
    if len(axes) != value.ndim or not set(axes) - {None} <= set(AXIS_NAMES):
        raise ValueError(f"logical axes {axes} do not name the {value.ndim} dimensions of a {value.shape} parameter")
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


def normal(rngs: nnx.Rngs, shape: Sequence[int], axes: Sequence[str | None], *, std: float = INIT_STD) -> nnx.Param:
    """A float32 weight of ``shape`` drawn from N(0, std²), its dimensions named ``axes`` (`AXIS_NAMES`)."""
    return _param(std * jax.random.normal(rngs.params(), tuple(shape), jnp.float32), axes)


def zeros(shape: Sequence[int], axes: Sequence[str | None]) -> nnx.Param:
    """A float32 parameter of ``shape``, all zeros, its dimensions named ``axes``."""
    return _param(jnp.zeros(tuple(shape), jnp.float32), axes)


def ones(shape: Sequence[int], axes: Sequence[str | None]) -> nnx.Param:
    """A float32 parameter of ``shape``, all ones, its dimensions named ``axes``."""
    return _param(jnp.ones(tuple(shape), jnp.float32), axes)


def declared_axes(leaf) -> tuple[str | None, ...] | None:
    """The logical axis names ``leaf`` carries (one per dimension), or None where it carries none.

    A parameter, and a variable derived from one that keeps its metadata (an optax moment of
    the pure view, an ``nnx.Optimizer``'s ``OptVariable``), carries its parameter's names; a
    plain array or a variable made without them (an ``nnx.Optimizer``'s step count) carries none.
    The one reader behind `jaxformer.models.pure.logical_axes` and `jaxformer.parallel.rules.param_shardings`.
    """
    names = leaf.get_metadata().get("out_sharding") if isinstance(leaf, nnx.Variable) else None
    return None if names is None else tuple(names)


def residual_std(num_layers: int) -> float:
    """GPT-2's scaled init for projections that write into the residual stream."""
    return INIT_STD / math.sqrt(2 * num_layers)
