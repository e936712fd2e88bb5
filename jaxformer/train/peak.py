"""The matmul peak MFU is measured against: probed once per machine and process layout, then cached.

A probe is a few jitted ``[n, n] @ [n, n]`` products; run at the start of every run it gave
numbers that moved with whatever else the machine was doing, so MFU figures could not be
compared across runs. `machine_peak_flops` keeps the best probe per (CPU model, JAX version,
backend, devices, XLA flags, dtype) in ``~/.cache/jaxformer/peak.json`` and reuses it; a run that trains
faster than the kept peak has it probed again.
"""

from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path

import jax

from jaxformer.files import read_json, write_cache

PEAK_FILE = Path("~/.cache/jaxformer/peak.json").expanduser()


def probe_matmul_peak(dtype: str = "float32", n: int = 1024, repeats: int = 10, impl: str = "xla",
                      min_seconds: float | None = None) -> float:
    """FLOP/s of the best of ``repeats`` jitted ``[n, n] @ [n, n]`` products (2n³ FLOPs each) of random values.

    ``impl``: `jaxformer.functional.dense`'s. ``xla`` multiplies on the default device (XLA:CPU
    threads its large matmuls over the cores); ``onednn`` splits the rows over every local device,
    each calling oneDNN with its share of the cores, as a data-parallel train step does.
    ``min_seconds``: ``n`` is doubled (up to `MAX_PROBE_N`) until the best product takes at least this long. By default
    0 on the CPU, whose products of ``n`` = 1024 already take milliseconds (and whose PyTorch peer probes that size),
    and 1 ms on an accelerator, where a product of 1024 is over before its launch latency is (MFU read above 100%:
    experiments/gpu_check/README.md).
    """
    if min_seconds is None:
        min_seconds = 0.0 if jax.default_backend() == "cpu" else 1e-3
    best, n = _best_product_seconds(dtype, n, repeats, impl)
    while best < min_seconds and n < MAX_PROBE_N:
        best, n = _best_product_seconds(dtype, 2 * n, repeats, impl)
    return 2.0 * n**3 / best


MAX_PROBE_N = 16384  # bf16 operands of 0.5 GiB each


def _best_product_seconds(dtype: str, n: int, repeats: int, impl: str) -> tuple[float, int]:
    """The best of ``repeats`` timed ``[n, n] @ [n, n]`` products by ``impl`` (after one that compiles), and ``n``."""
    from jaxformer.functional.dense import dense

    a = jax.random.normal(jax.random.key(0), (n, n), dtype=dtype)
    matmul = jax.jit(lambda x, y: dense(x, y, impl=impl))
    b = a
    if impl != "xla":
        from jax.sharding import NamedSharding, PartitionSpec

        mesh = jax.make_mesh((jax.local_device_count(),), ("rows",))
        a, b = jax.device_put(a, NamedSharding(mesh, PartitionSpec("rows"))), jax.device_put(a, NamedSharding(mesh, PartitionSpec()))
    matmul(a, b).block_until_ready()  # compile
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best, n


def cpu_model() -> str:
    """The CPU's model name (``lscpu``'s "Model name"), or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(dtype: str) -> str:
    """What the peak depends on: the chip, the software, the devices and threads this process was given."""
    devices = jax.local_devices()
    return " | ".join([cpu_model(), f"jax {jax.__version__}", jax.default_backend(), devices[0].device_kind,
                       f"{len(devices)} devices", os.environ.get("XLA_FLAGS", ""), dtype])


# (cache file, key) pairs probed again in this process: at most once each
_REPROBED: set[tuple[str, str]] = set()


def machine_peak_flops(dtype: str = "float32", path: Path = PEAK_FILE, impl: str = "xla",
                       at_least: float = 0.0) -> float:
    """The cached peak of this machine and layout for ``dtype`` multiplied by ``impl`` (`probe_matmul_peak`),
    probing (and caching) it the first time.

    ``at_least``: a rate (FLOP/s) a run has just achieved. A cached peak below it was probed while the machine was
    busy and would put MFU above 100%, so it is probed again (once per process) and the larger of the two kept.
    """
    key = machine_key(dtype) + ("" if impl == "xla" else f" | {impl}")
    cache = read_json(path)
    if not isinstance(cache.get(key), (int, float)):  # missing, or not a peak (a corrupt file): probed
        cache.pop(key, None)
    if key not in cache or (cache[key] < at_least and (str(path), key) not in _REPROBED):
        if key in cache:
            _REPROBED.add((str(path), key))
        cache[key] = max(cache.get(key, 0.0), probe_matmul_peak(dtype, impl=impl))
        write_cache(path, cache)
    return float(cache[key])
