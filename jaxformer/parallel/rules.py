"""The rules table: which mesh axes each logical axis is split over, kept apart from the math.

Every parameter names its dimensions with logical axes (`jaxformer.nn.params`); this table
maps those names to mesh axes (MaxText's ``logical_axis_rules``). The defaults give

- FSDP (ZeRO-3): ``embed`` over ``fsdp`` — every weight matrix, and the optimizer moments
  shaped like it, is split along the model width; the partitioner all-gathers a layer's
  weights for its matmuls and reduce-scatters their gradients;
- tensor parallelism (Megatron): ``heads``/``kv_heads``, ``mlp`` and ``vocab`` over ``tensor`` —
  column-parallel QKV and FFN-in, row-parallel output projections, vocabulary-parallel logits;
- expert parallelism: ``experts`` over ``expert`` — each device group holds some experts;
- the batch (not a parameter axis) over ``(data, fsdp, expert)``: every axis that does not
  split the model's work within a layer splits the examples instead.

A dimension whose size is not a multiple of its mesh axes' product is replicated instead
(e.g. 2 KV heads on a tensor axis of 4: each device keeps both, as Megatron does for GQA).
`jaxformer.parallel.layout` refuses that fallback for the model width, heads, MLP width and experts, where
replicating would silently waste the axis. A mesh axis serves at most one dimension of a
parameter (the first that claims it); axes of size 1 are left out of the specs.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxformer.nn.params import AXIS_NAMES, declared_axes
from jaxformer.parallel.mesh import MESH_AXES

Rules = Mapping[str, tuple[str, ...]]

# the batch, then every parameter axis (`AXIS_NAMES`): replicated unless split below
DEFAULT_RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp", "expert"),
    **dict.fromkeys(AXIS_NAMES, ()),
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "experts": ("expert",),
}


def resolve_rules(overrides: Mapping[str, Any] | None = None) -> dict[str, tuple[str, ...]]:
    """`DEFAULT_RULES` updated by ``parallel.rules`` (a mesh axis, a list of them, or null to replicate).

    Raises ``ValueError`` naming the override for an unknown logical or mesh axis.
    """
    rules = dict(DEFAULT_RULES)
    for name, value in (overrides or {}).items():
        if name not in DEFAULT_RULES:
            raise ValueError(f"parallel.rules.{name}: unknown logical axis (known: {', '.join(DEFAULT_RULES)})")
        if not (value is None or isinstance(value, str)
                or (isinstance(value, (list, tuple)) and all(isinstance(axis, str) for axis in value))):
            raise ValueError(f"parallel.rules.{name} must be a mesh axis, a list of them or null, got {value!r}")
        axes = () if value is None else (value,) if isinstance(value, str) else tuple(value)
        for axis in axes:
            if axis not in MESH_AXES:
                raise ValueError(f"parallel.rules.{name}: {axis!r} is not a mesh axis ({', '.join(MESH_AXES)})")
        if len(set(axes)) != len(axes):
            raise ValueError(f"parallel.rules.{name}: mesh axis repeated in {list(axes)}")
        rules[name] = axes
    return rules


def rule_size(mesh: Mesh, rules: Rules, name: str) -> int:
    """How many ways logical axis ``name`` is split: the product of its mesh axes' sizes."""
    return math.prod(mesh.shape[axis] for axis in rules[name])


def spec_for(names: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh, rules: Rules) -> PartitionSpec:
    """The ``PartitionSpec`` of an array whose dimensions have logical ``names`` and sizes ``shape``."""
    used: set[str] = set()
    parts = []
    for name, size in zip(names, shape, strict=True):
        axes = tuple(a for a in (rules[name] if name else ()) if a not in used and mesh.shape[a] > 1)
        if size % math.prod(mesh.shape[a] for a in axes):
            axes = ()  # not evenly divisible: replicate this dimension
        used.update(axes)
        parts.append(_entry(axes))
    return PartitionSpec(*parts)


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def param_shardings(tree: Any, mesh: Mesh, rules: Rules) -> Any:
    """``tree`` with each parameter replaced by its ``NamedSharding`` and every other leaf by a replicated one.

    ``tree`` holds ``nnx.Param`` leaves (arrays or ``ShapeDtypeStruct``), each carrying the
    logical axes `jaxformer.models.pure.logical_axes` reads — the parameters from
    ``init_params``, or a whole train state: Optax builds the moments by mapping over the
    parameters, so they are ``nnx.Param`` with the same logical axes and get the same
    sharding (an ``nnx.Optimizer``'s state likewise: its moments are variables that keep the
    parameters' axes). Scalars and counters (step, sums; an ``nnx.Optimizer``'s step count,
    a variable without axes) are replicated. The result is a prefix tree of ``tree``, as
    ``jax.jit``'s ``in_shardings``/``out_shardings`` and ``jax.device_put`` take it.
    """
    replicated = NamedSharding(mesh, PartitionSpec())

    def sharding(leaf):
        names = declared_axes(leaf)  # as `logical_axes` reads them
        return replicated if names is None else NamedSharding(mesh, spec_for(names, leaf.shape, mesh, rules))

    return jax.tree.map(sharding, tree, is_leaf=_is_variable)


def batch_spec(ndim: int, batch_dim: int, mesh: Mesh, rules: Rules) -> PartitionSpec:
    """``[..., B, ...]`` (``ndim`` dimensions) split over the batch rule's mesh axes along ``batch_dim``."""
    parts: list = [None] * ndim
    parts[batch_dim] = _entry(tuple(a for a in rules["batch"] if mesh.shape[a] > 1))
    return PartitionSpec(*parts)


def _entry(axes: tuple[str, ...]) -> str | tuple[str, ...] | None:
    """One ``PartitionSpec`` entry: nothing, one mesh axis, or several (major to minor)."""
    return None if not axes else axes[0] if len(axes) == 1 else axes
