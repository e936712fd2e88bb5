"""`Layout`: a mesh plus the rules table — where each array of a run lives, and the checks that go with it.

::

    layout = Layout.from_config(config.parallel, micro_batch=32)   # mesh over all devices of all processes
    layout.check(config.model, micro_batch=32)          # one-line ValueError before any compilation
    layout = Layout.for_run(config.parallel, config.model, micro_batch=32)   # both, for a training run
    graphdef, state = layout.materialize(build)         # created sharded, never whole on one device
    shardings = layout.shardings(state)                 # for jit's in_shardings / out_shardings
    sharding = layout.batch_sharding((A, B, T + 1), batch_dim=1)
    rows = layout.process_rows(sharding, (A, B, T + 1), batch_dim=1)   # the rows this process feeds
    batch = layout.global_array(local_rows_data, sharding, (A, B, T + 1))
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxformer.architecture import ModelConfig
from jaxformer.parallel.config import ParallelConfig
from jaxformer.parallel.mesh import make_mesh
from jaxformer.parallel.rules import Rules, batch_spec, param_shardings, resolve_rules, rule_size

# XLA's backend optimisation level for a program that runs once, such as a run's initial state, whose compile time
# is its whole cost. Level 1 compiles it markedly faster than the default (3) and gave bit-identical states on the
# main job's models (a test holds it to that); level 0 changed their last bit (docs/sweep-speed.md, sessions 16 and
# 17). CPU only: that is where the bits were compared.
RUN_ONCE_OPTIMIZATION_LEVEL = 1


def jit_once(fun: Callable, **jit_kwargs) -> Callable:
    """``jax.jit(fun, **jit_kwargs)`` compiled for a single call (`RUN_ONCE_OPTIMIZATION_LEVEL` on a CPU)."""
    if jax.default_backend() == "cpu":
        jit_kwargs["compiler_options"] = {"xla_backend_optimization_level": RUN_ONCE_OPTIMIZATION_LEVEL}
    return jax.jit(fun, **jit_kwargs)


def _devices_dividing(devices: list[jax.Device], sizes: dict[str, int], rules: Rules,
                      micro_batch: int) -> list[jax.Device]:
    """The first ``data·fixed`` devices, ``data`` the largest count ≤ the free devices splitting ``micro_batch``
    together with the rules' other batch axes."""
    fixed = math.prod(size for axis, size in sizes.items() if axis != "data")
    if len(devices) % fixed or "data" not in rules["batch"]:
        return devices  # make_mesh reports the mismatch; a data axis that does not split the batch takes them all
    other_batch_ways = math.prod(sizes[axis] for axis in rules["batch"] if axis != "data")
    data = len(devices) // fixed
    while data > 1 and micro_batch % (data * other_batch_ways):
        data -= 1
    return devices[:data * fixed]


@dataclasses.dataclass(frozen=True)
class Layout:
    """The device mesh and the logical→mesh rules of a run."""

    mesh: Mesh
    rules: Rules

    @classmethod
    def from_config(cls, parallel: ParallelConfig, devices: Sequence[jax.Device] | None = None, *,
                    micro_batch: int | None = None) -> Layout:
        """The layout ``parallel`` describes over ``devices`` (default: every device of every process).

        ``micro_batch``: sequences per micro-batch. When ``parallel.mesh.data`` is -1 (the
        default) in a single process and the devices do not divide it, the mesh takes the
        most leading devices that do (e.g. 2 of 4 cores for a batch of 6), so the default
        never rejects a batch size.

        Raises ``ValueError`` when the mesh sizes do not multiply to the device count or a rule is unknown.
        """
        rules = resolve_rules(parallel.rules)
        sizes = dataclasses.asdict(parallel.mesh)
        if devices is None and micro_batch is not None and sizes["data"] == -1 and jax.process_count() == 1:
            devices = _devices_dividing(jax.devices(), sizes, rules, micro_batch)
        return cls(make_mesh(sizes, devices), rules)

    @classmethod
    def for_run(cls, parallel: ParallelConfig, model: ModelConfig, micro_batch: int,
                devices: Sequence[jax.Device] | None = None) -> Layout:
        """The layout a training run uses (over ``devices``, default all), checked against its model and micro-batch."""
        layout = cls.from_config(parallel, devices, micro_batch=micro_batch)
        layout.check(model, micro_batch)
        return layout

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def batch_shards(self) -> int:
        """Into how many parts a batch is split (data × fsdp × expert with the default rules)."""
        return rule_size(self.mesh, self.rules, "batch")

    def _axes(self, logical: str) -> str:
        return " × ".join(f"parallel.mesh.{axis}" for axis in self.rules[logical])

    def check(self, model: ModelConfig, micro_batch: int) -> None:
        """The model width (FSDP's axis), heads, MLP width and experts must split evenly over their mesh axes; so
        must each micro-batch.

        (Other dimensions fall back to replication; for these it would leave the axis idle.)
        Raises ``ValueError``: one line naming both numbers.
        """
        mlp_field, mlp = ("model.expert_d_ff", model.expert_d_ff) if model.is_moe else ("model.d_ff", model.d_ff)
        sizes = [("embed", "model.d_model", model.d_model), ("heads", "model.num_heads", model.num_heads),
                 ("mlp", mlp_field, mlp)]
        if model.is_moe:
            sizes.append(("experts", "model.num_experts", model.num_experts))
        for logical, field, size in sizes:
            ways = rule_size(self.mesh, self.rules, logical)
            if size % ways:
                raise ValueError(f"{field}={size} is not divisible by {self._axes(logical)}={ways}")
        if micro_batch % self.batch_shards:
            raise ValueError(f"train.batch_size / train.grad_accum = {micro_batch} sequences per micro-batch is not "
                             f"divisible by {self._axes('batch')} = {self.batch_shards}")

    def shardings(self, tree: Any) -> Any:
        """`jaxformer.parallel.rules.param_shardings` of ``tree`` on this layout."""
        return param_shardings(tree, self.mesh, self.rules)

    def materialize(self, build: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
        """``(graphdef, state)`` of ``build()``, run under ``jax.jit`` with the state's shardings as outputs.

        Each device computes only its own shards of the initial parameters and optimizer state,
        so a model too big for one device (or one host) can still be created.
        """
        graphdef, abstract = jax.eval_shape(build)
        state = jit_once(lambda: build()[1], out_shardings=self.shardings(abstract))()
        return graphdef, state

    def batch_sharding(self, shape: tuple[int, ...], batch_dim: int) -> NamedSharding:
        """Split along ``batch_dim`` over the batch axes, or replicated when that size does not divide."""
        if shape[batch_dim] % self.batch_shards:
            return self.replicated
        return NamedSharding(self.mesh, batch_spec(len(shape), batch_dim, self.mesh, self.rules))

    @staticmethod
    def process_rows(sharding: NamedSharding, shape: tuple[int, ...], batch_dim: int) -> range:
        """The indices along ``batch_dim`` that this process's devices hold (every index when replicated)."""
        spans = {index[batch_dim].indices(shape[batch_dim])[:2]
                 for index in sharding.addressable_devices_indices_map(shape).values()}
        low, high = min(start for start, _ in spans), max(stop for _, stop in spans)
        if sum(stop - start for start, stop in spans) != high - low:
            raise ValueError(f"this process's devices hold batch rows {sorted(spans)}, not one contiguous block; "
                             "reorder parallel.mesh so processes span the outer (data, fsdp) axes")
        return range(low, high)

    @staticmethod
    def global_array(local: np.ndarray, sharding: NamedSharding, shape: tuple[int, ...]) -> jax.Array:
        """The global array ``shape`` from this process's part ``local`` (its `process_rows`)."""
        return jax.make_array_from_process_local_data(sharding, local, shape)
