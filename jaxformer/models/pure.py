"""The pure-function view of a model: a parameter pytree and ``apply``, for training and sharding.

``params`` is an ``nnx.State`` (a nested mapping, module path -> ``nnx.Param``): a
pytree whose leaves are the arrays, so ``jax.grad``, ``optax`` and Orbax take it as
is; each ``nnx.Param`` also carries its logical axis names (``out_sharding`` metadata),
read by :func:`logical_axes`. ``graphdef`` is the static rest of the model (hashable:
pass it to ``jax.jit`` as a static argument or close over it)::

    graphdef, params = init_params(cfg, seed=0)
    loss = lambda p, x, y: cross_entropy(apply(graphdef, p, x)[0], y)
    grads = jax.jit(jax.grad(loss))(params, x, y)       # grads: an nnx.State like params
    axes = logical_axes(params)                          # same structure, tuples of names
    plain = nnx.to_pure_dict(params)                     # {'decoder': {'blocks': {0: …}}} of arrays
"""

from __future__ import annotations

import jax
from flax import nnx

from jaxformer.models.build import build_model
from jaxformer.nn.params import declared_axes
from jaxformer.architecture import ModelConfig
from jaxformer.kernel import KernelConfig


def init_params(cfg: ModelConfig, seed: int | jax.Array, kernel: KernelConfig = KernelConfig()) -> tuple[nnx.GraphDef, nnx.State]:
    """``(graphdef, params)`` of the model ``cfg`` describes, initialised from ``seed``, computing with ``kernel``."""
    return nnx.split(build_model(cfg, rngs=nnx.Rngs(params=jax.random.key(seed)), kernel=kernel))


def apply(graphdef: nnx.GraphDef, params: nnx.State, *inputs: jax.Array, **kwargs) -> tuple[jax.Array, jax.Array]:
    """``(logits, aux_loss)`` of the model with ``params`` on ``inputs`` (tokens, or source and target).

    Pure: usable inside ``jax.jit``/``jax.grad``/``jax.vmap``; ``kwargs`` go to the
    model's ``__call__`` (e.g. ``lengths``; ``drop_tokens=True`` for the MoE training
    forward, which drops assignments past ``cfg.capacity_factor`` — inference never does).
    """
    return nnx.merge(graphdef, params)(*inputs, **kwargs)


def _is_param(x) -> bool:
    return isinstance(x, nnx.Variable)


def logical_axes(params: nnx.State) -> nnx.State:
    """The same structure as ``params`` with each leaf replaced by its tuple of logical axis names.

    Names come from "vocab", "embed", "heads", "kv_heads", "head_dim", "mlp",
    "experts", "norm", "position" or None (one per dimension). ``params`` may also be a
    train state: an optimizer's moments carry their parameters' names, and a leaf that
    carries none (a step count, ``nnx.Optimizer``'s included) gets None for each of its
    dimensions — ``()`` for a scalar — the replicated layout `jaxformer.parallel.rules.param_shardings`
    gives it. Map the two trees together with
    ``jax.tree.map(f, logical_axes(p), p, is_leaf=lambda x: isinstance(x, tuple))``.
    """
    def names(leaf) -> tuple[str | None, ...]:
        declared = declared_axes(leaf)
        return (None,) * len(getattr(leaf, "shape", ())) if declared is None else declared

    return jax.tree.map(names, params, is_leaf=_is_param)
