"""The machine's accelerators, for a sweep's layout: one warm worker per GPU, each seeing its own device.

A sweep's launching process trains nothing, and it must not hold the accelerators its workers train on: a JAX
process that starts a GPU backend takes most of the device's memory at once (XLA's preallocation), so sixteen
workers of the CPU layout, or the launcher's own fit between stages, exhaust one GPU; and a TPU host's chips
belong to one process. So the launcher asks a short-lived child process which backend JAX would use and which
local devices it has (`local_accelerators`; only where an accelerator plugin is installed, so a CPU-only install
starts no child), keeps its own JAX on the CPU (`keep_launcher_on_cpu`), and gives worker ``slot`` the environment
that shows it one device (`worker_environment`): JAX's own ``JAX_CUDA_VISIBLE_DEVICES`` /
``JAX_ROCM_VISIBLE_DEVICES``, which count the devices the user's ``CUDA_VISIBLE_DEVICES`` leaves. A TPU's chips
stay together in one worker.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys

from jaxformer.runtime import plugin_installed

# the JAX settings that restrict a process to some of the GPUs (jax._src.xla_bridge), by plugin
VISIBLE_DEVICES = ("JAX_CUDA_VISIBLE_DEVICES", "JAX_ROCM_VISIBLE_DEVICES")
PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
_PROBE = ("import json, jax; devices = jax.local_devices(); "
          "print(json.dumps([jax.default_backend(), [d.local_hardware_id if d.local_hardware_id is not None "
          "else d.id for d in devices]]))")


@dataclasses.dataclass(frozen=True)
class Accelerators:
    """``platform``: JAX's backend name (``gpu``, ``tpu``); ``ids``: the local devices' hardware ids."""

    platform: str
    ids: tuple[int, ...]

    @property
    def workers(self) -> int:
        """Warm workers the layout starts: one per GPU; one for a TPU host's chips (one process owns them)."""
        return len(self.ids) if self.platform == "gpu" else 1

    def describe(self) -> str:
        return f"{len(self.ids)} {self.platform} device{'s' if len(self.ids) != 1 else ''}"


@functools.cache
def local_accelerators() -> Accelerators | None:
    """This machine's accelerators as a JAX process started here sees them, None where that is the CPU alone (or
    the probe fails: then the CPU layout is used and its workers meet the error themselves)."""
    if not plugin_installed():
        return None
    env = {**os.environ, PREALLOCATE: "false"}  # the probe must not take the devices' memory while it looks
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=300)
        platform, ids = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return None
    return None if platform == "cpu" or not ids else Accelerators(platform, tuple(ids))


def keep_launcher_on_cpu() -> None:
    """Restricts this (the launching) process's JAX to the CPU where the workers train on accelerators; call it
    before this process starts a JAX backend."""
    if local_accelerators() is not None:
        import jax

        jax.config.update("jax_platforms", "cpu")


def worker_environment(env: dict[str, str], slot: int, workers: int,
                       accelerators: Accelerators | None) -> dict[str, str]:
    """``env`` for worker ``slot`` of ``workers``: on GPUs it sees device ``slot`` modulo their count; workers that
    share a device do not preallocate its memory (unless the user said otherwise). Unchanged elsewhere."""
    if accelerators is None or accelerators.platform != "gpu":
        return env
    ids = accelerators.ids
    env = {**env, **{name: str(ids[slot % len(ids)]) for name in VISIBLE_DEVICES}}
    if workers > len(ids):
        env.setdefault(PREALLOCATE, "false")
    return env
