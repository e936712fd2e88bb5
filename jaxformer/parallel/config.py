"""The ``parallel`` section of a run: device mesh, multi-process start-up and the sharding rules.

It never changes the math, only where arrays live; `jaxformer.parallel.Layout` turns it into a
mesh. Checks here need no devices; sizes against the devices and the model are checked by the layout.
"""

from __future__ import annotations

import dataclasses

from jaxformer.configs import NON_NEGATIVE, POSITIVE, Section, setting


@dataclasses.dataclass(frozen=True)
class MeshConfig(Section):
    """Device-mesh axis sizes; their product is the device count. -1 (at most one axis): the remaining devices.

    data: pure data parallelism (parameters replicated), the default over every device, as
    DDP. fsdp: data parallelism with parameters and optimizer state sharded (ZeRO-3), for
    models too big to replicate: ``parallel.mesh.data=1 parallel.mesh.fsdp=-1``. tensor:
    attention heads and MLP columns split (Megatron). expert: MoE experts split; it also
    splits the batch, like data. On a CPU the `jaxformer` command makes each core a device
    (`jaxformer.runtime`), so the default trains data-parallel over the cores.
    """

    SECTION = "parallel.mesh"

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1

    def check(self) -> None:
        axes = dataclasses.asdict(self)
        for name, size in axes.items():
            if size != -1 and size <= 0:
                raise ValueError(f"parallel.mesh.{name} must be positive or -1 (all remaining devices), got {size}")
        if list(axes.values()).count(-1) > 1:
            raise ValueError(f"at most one parallel.mesh axis may be -1, got {axes} (data is -1 by default: "
                             "FSDP over every device is parallel.mesh.data=1 parallel.mesh.fsdp=-1)")


def check_address(address: str, name: str) -> None:
    """One-line ``ValueError`` naming ``name`` unless ``address`` is ``host:port`` (``[v6 address]:port``),
    the port in 1–65535: JAX's coordinator otherwise fails with a traceback, a crash or a 5-minute wait."""
    host, _, port = str(address).rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if (not host.strip("[] ") or (":" in host and not bracketed) or not port.isdigit()
            or not 1 <= int(port) <= 65535):
        raise ValueError(f"{name} must be host:port (a port in 1-65535), got {address!r}")


@dataclasses.dataclass(frozen=True)
class DistributedConfig(Section):
    """Multi-process runs (one process per host or per accelerator) through ``jax.distributed.initialize``.

    initialize: true / false, or null (auto): initialise when a coordinator address or a
      process count is given here or in the environment (``JAX_COORDINATOR_ADDRESS``,
      ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), or under a multi-task SLURM step or Open MPI
      launch. With ``initialize: true`` and nothing else set, JAX detects the rest on Cloud
      TPU, SLURM and Open MPI.
    coordinator_address: ``host:port`` of process 0's coordinator service.
    initialization_timeout: seconds each process waits for all of them to connect (JAX's default, 300; a
      large job's processes may start minutes apart). JAX ends a process whose wait runs out (SIGABRT,
      "DEADLINE_EXCEEDED").
    """

    SECTION = "parallel.distributed"

    initialize: bool | None = None
    coordinator_address: str | None = None
    num_processes: int | None = setting(None, POSITIVE)
    process_id: int | None = setting(None, NON_NEGATIVE)
    initialization_timeout: int = setting(300, POSITIVE)

    def check(self) -> None:
        if self.coordinator_address is not None:
            check_address(self.coordinator_address, "parallel.distributed.coordinator_address")
        if None not in (self.process_id, self.num_processes) and self.process_id >= self.num_processes:
            raise ValueError(f"parallel.distributed.process_id={self.process_id} must be below "
                             f"parallel.distributed.num_processes={self.num_processes}")


@dataclasses.dataclass(frozen=True)
class ParallelConfig(Section):
    """How the run is laid out on devices (`jaxformer.parallel`); it never changes the math.

    rules: overrides of the logical-axis → mesh-axis table (`jaxformer.parallel.rules`), e.g.
    ``parallel.rules.embed=null`` (replicate) or ``parallel.rules.mlp=[tensor, fsdp]``.
    """

    SECTION = "parallel"

    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
    rules: dict = dataclasses.field(default_factory=dict)
