"""Multi-process start-up: ``jax.distributed.initialize`` from ``parallel.distributed`` and the environment.

One process runs per host (TPU) or per node/accelerator (GPU); after initialisation
``jax.devices()`` lists the devices of every process, the mesh spans them all, and each
process feeds only the batch rows its own devices hold (`jaxformer.parallel.layout`).
On CPU the processes exchange data through Gloo (``jax_cpu_collectives_implementation``,
JAX's default), which is how the tests run two processes on one machine.

`initialize` must run before anything touches a JAX backend (even ``jax.devices()``).
`exchange` and `from_process_0` are how the processes agree on host-side values: through the
coordination service's key-value store, never through an XLA collective, so that they cannot
interleave with the programs the processes run (or with Orbax's barriers) in different orders.
"""

from __future__ import annotations

import collections
import os
import socket
import time
from typing import Mapping

import jax

from jaxformer.parallel.config import DistributedConfig, check_address


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {text!r}") from None


def launcher_detected(environ: Mapping[str, str]) -> bool:
    """Whether a job launcher started several processes: a SLURM ``srun`` step or an Open MPI ``mpirun``."""
    return (_env_int(environ, "SLURM_STEP_NUM_TASKS") or 1) > 1 or (_env_int(environ, "OMPI_COMM_WORLD_SIZE") or 1) > 1


def wait_for_coordinator(address: str, timeout: float) -> float:
    """Seconds until something listens at the coordinator's ``address`` (``host:port``); after ``timeout`` seconds
    raises a one-line ``ValueError``. A process other than the coordinator waits here first because JAX's own client,
    when its deadline passes, ends the process with a native stack instead of an error."""
    host, _, port = address.rpartition(":")
    started = time.monotonic()
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return time.monotonic() - started
        except OSError as error:
            reason = error.strerror or str(error)
        if time.monotonic() - started >= timeout:
            raise ValueError(f"parallel.distributed.coordinator_address {address}: no coordinator listening after "
                             f"{timeout:g} s (initialization_timeout): {reason}")
        time.sleep(0.25)


def initialize(config: DistributedConfig, environ: Mapping[str, str] = os.environ) -> bool:
    """Initialises the JAX distributed system when asked to; returns whether it is initialised.

    Settings come from ``config``, else from ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``
    and ``JAX_PROCESS_ID``; what is still unset JAX detects on Cloud TPU, SLURM and Open MPI.
    ``config.initialize`` null (auto) initialises when any of the three is set or a launcher
    started several processes. Calling it again is a no-op. A setting JAX cannot complete, or a
    coordinator that never listens (`wait_for_coordinator`), raises ``ValueError`` naming ``parallel.distributed``.
    """
    if jax.distributed.is_initialized():
        return True
    address = config.coordinator_address or environ.get("JAX_COORDINATOR_ADDRESS")
    processes = config.num_processes if config.num_processes is not None else _env_int(environ, "JAX_NUM_PROCESSES")
    process_id = config.process_id if config.process_id is not None else _env_int(environ, "JAX_PROCESS_ID")
    wanted = config.initialize
    if wanted is None:
        wanted = address is not None or processes is not None or process_id is not None or launcher_detected(environ)
    if not wanted:
        return False
    if address is not None and not config.coordinator_address:
        check_address(address, "JAX_COORDINATOR_ADDRESS")
    timeout = config.initialization_timeout
    if address is not None and process_id:  # not the coordinator, which waits for its peers inside JAX
        timeout = max(1, round(timeout - wait_for_coordinator(address, timeout)))
    try:
        jax.distributed.initialize(coordinator_address=address, num_processes=processes, process_id=process_id,
                                   initialization_timeout=timeout)
    except (ValueError, RuntimeError) as error:  # RuntimeError: what the coordination service reports
        raise ValueError(f"parallel.distributed: {error} (set coordinator_address, num_processes and process_id, "
                         "or launch under SLURM, Open MPI or on a Cloud TPU slice)") from None
    return True


EXCHANGE_TIMEOUT_MS = 30 * 60 * 1000  # a process that never arrives (it crashed) fails the others after this
_exchanged: collections.Counter[str] = collections.Counter()


def exchange(name: str, value: bytes) -> list[bytes]:
    """Every process's ``value`` for this exchange, in process order (``[value]`` in a single process).

    Every process must make the same exchanges in the same order: the n-th exchange named ``name``
    in one process meets the n-th of that name in the others. Raises when a process has not arrived
    within `EXCHANGE_TIMEOUT_MS`.
    """
    if jax.process_count() == 1:
        return [value]
    from jax._src import distributed  # the coordination-service client that Orbax's barriers use too

    client, index = distributed.global_state.client, _exchanged[name]
    _exchanged[name] += 1
    key = f"jaxformer/{name}/{index}"
    client.key_value_set_bytes(f"{key}/{jax.process_index()}", value)
    return [client.blocking_key_value_get_bytes(f"{key}/{process}", EXCHANGE_TIMEOUT_MS)
            for process in range(jax.process_count())]


def from_process_0(name: str, value: int) -> int:
    """Process 0's ``value`` in every process (``value`` itself in a single process)."""
    return int(exchange(name, str(int(value)).encode())[0])
