"""Process settings that make XLA:CPU training fast; they must be in place before the process starts.

XLA:CPU allocates an executable's scratch memory afresh on every call. glibc's ``malloc``
serves blocks over 32 MiB with fresh ``mmap`` mappings, so every train step touches
new 4 KiB pages and pays a minor page fault for each. The glibc tunable
``glibc.malloc.hugetlb=1`` (glibc ≥ 2.35; older ones ignore it) makes ``malloc`` ask for
transparent huge pages on those mappings: 2 MiB pages, each fault covering 512 times
the memory of a 4 KiB one. Those faults still zero every page of the scratch at every call;
``glibc.malloc.mmap_max=0`` makes ``malloc`` serve large blocks from its heaps instead, and a
4 GiB ``glibc.malloc.trim_threshold`` keeps the freed block mapped for the next call, which
then reuses it without faulting. XLA's own threads allocate from malloc arenas whose heaps hold at
most 64 MiB each (:func:`run_inline_on_cpu`), so :func:`compile_program` splits a program's scratch
into blocks of at most 48 MiB, and a 128 MiB ``glibc.malloc.top_pad`` stops glibc from unmapping a
thread's heap the moment every block in it is free.

XLA's YNNPACK fusions (matmuls fused with their neighbours) are switched off with
``--xla_cpu_experimental_ynn_fusion_type=``: they speed up a bare matmul but not the
train step, which runs faster without them, most at the sweeps' small sizes. Only in a
process of one device (a sweep worker, a one-core machine): with several, this jaxlib's
(0.10.2) programs over a mesh come out wrong without the fusions once a loop in one program
(the validation pass's batches, gradient accumulation's micro-batches) has run long enough
on a large enough model (SmolLM2-135M's validation loss 10.35 nats for 4.85 after 28 of 64
batches; ``tests/test_runtime_mesh_loop.py``).

XLA:CPU runs each fused kernel on one thread (only large matmuls use the others), so one
device leaves a second core mostly idle on a small model. ``--xla_force_host_platform_device_count``
makes each usable core a JAX device, and the default mesh (``parallel.mesh.data=-1``) trains
data-parallel over them, each device on its share of the batch.

The measurements behind each setting are in docs/cpu-speed.md (changes 1, 2 and 5; sessions 27 and 28).

Tunables are read when a process starts and XLA flags when JAX starts, so the `jaxformer`
command re-executes itself once with both set (:func:`reexec_tuned`), and the sweep's
training processes inherit them. ``JAXFORMER_TUNE=0`` turns this off; a library user sets
the variables before starting Python (:func:`tuned_environment` says what to set).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

HUGE_PAGES = "glibc.malloc.hugetlb=1"
# glibc settings added to the environment (each unless the user set that tunable): huge pages, large blocks from
# malloc's heaps, kept mapped when freed, and a thread arena's emptied heaps kept too
MALLOC_TUNABLES = (HUGE_PAGES, "glibc.malloc.mmap_max=0", "glibc.malloc.trim_threshold=4294967296",
                   "glibc.malloc.top_pad=134217728")
# the largest block of scratch a program compiled by `compile_program` asks malloc for: one fits a thread arena's heap
SCRATCH_BLOCK_BYTES = 48 << 20
_MULTIHEAP = "xla_multiheap_size_constraint_per_heap"
NO_YNN_FUSION = "--xla_cpu_experimental_ynn_fusion_type="
HOST_DEVICES = "--xla_force_host_platform_device_count"
# the sweep layout (processes × threads) `jaxformer bench train --layout` measured fastest on this machine
LAYOUT_FILE = Path("~/.cache/jaxformer/layout.json").expanduser()


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def plugin_installed() -> bool:
    """Whether JAX could start a backend other than the CPU: a PJRT plugin (the ``jax_plugins`` namespace or entry
    point, as `jax._src.xla_bridge` discovers them) or libtpu, unless ``JAX_PLATFORMS`` names the CPU alone."""
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return False
    return (importlib.util.find_spec("jax_plugins") is not None or importlib.util.find_spec("libtpu") is not None
            or bool(importlib.metadata.entry_points(group="jax_plugins")))


def host_devices(flags: str) -> int:
    """The CPU devices ``XLA_FLAGS`` text asks for (its last ``--xla_force_host_platform_device_count``; 1 without)."""
    counts = re.findall(rf"{HOST_DEVICES}=(\d+)", flags)
    return int(counts[-1]) if counts else 1


def without_ynn_fusion_on_one_device(flags: str) -> str:
    """``XLA_FLAGS`` text with YNNPACK's fusions switched off when it asks for one device and does not set them."""
    if "xla_cpu_experimental_ynn_fusion_type" in flags or host_devices(flags) != 1:
        return flags
    return f"{NO_YNN_FUSION} {flags}".strip()


def tuned_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the settings above added; a setting the user already made is kept as it is.

    ``JAXFORMER_TUNE=0`` in ``env`` returns it unchanged.
    """
    tuned = dict(env)
    if tuned.get("JAXFORMER_TUNE") == "0":
        return tuned
    tunables, flags = tuned.get("GLIBC_TUNABLES", ""), tuned.get("XLA_FLAGS", "")
    for setting in MALLOC_TUNABLES:
        if setting.split("=")[0] not in tunables:
            tunables = f"{tunables}:{setting}" if tunables else setting
    if tunables != tuned.get("GLIBC_TUNABLES", ""):
        tuned["GLIBC_TUNABLES"] = tunables
    if HOST_DEVICES not in flags:
        flags = f"{flags} {HOST_DEVICES}={usable_cores()}".strip()
    flags = without_ynn_fusion_on_one_device(flags)
    if flags != tuned.get("XLA_FLAGS", ""):
        tuned["XLA_FLAGS"] = flags
    return tuned


def reexec_tuned(argv: list[str]) -> None:
    """Replaces this process by ``python -m jaxformer.cli argv`` with the tuned environment, if it lacks it.

    Linux only (the tunable is glibc's); returns without doing anything when nothing would change.
    """
    if not sys.platform.startswith("linux"):
        return
    tuned = tuned_environment(os.environ)
    if tuned == dict(os.environ):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "jaxformer.cli", *argv], tuned)


def run_inline_on_cpu() -> None:
    """Runs this process's one-device CPU programs on the calling thread (JAX's ``jax_cpu_enable_async_dispatch``
    off), before its backend starts.

    XLA:CPU allocates a program's scratch on the thread that runs it. Its own threads allocate from malloc arenas
    whose heaps hold at most 64 MiB, so a larger scratch is mapped afresh, faulted in and zeroed at every step
    whatever the malloc tunables above say; the main thread's arena has no such limit and keeps the block. Programs
    over several devices run on XLA's threads either way (the setting applies to one-device programs only); there
    :func:`compile_program`'s blocks do the same, except for a single array over 48 MiB, which only this covers.
    """
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)


# an array type in StableHLO text: `tensor<16x256x64xf32>`, `tensor<i32>`
_TENSOR_TYPE = re.compile(r"tensor<((?:\d+x)*)([a-z][a-z0-9]*)")
_ELEMENT_BYTES = {"i1": 1, "i8": 1, "ui8": 1, "bf16": 2, "f16": 2, "i16": 2, "ui16": 2, "f32": 4, "i32": 4, "ui32": 4}


def largest_array_bytes(stablehlo: str) -> int:
    """Bytes of the largest array typed in a StableHLO module's text (global shapes: an upper bound on one
    device's); element types not listed count 8 bytes."""
    largest = 0
    for dims, element in _TENSOR_TYPE.findall(stablehlo):
        size = _ELEMENT_BYTES.get(element, 8)
        for dim in dims.split("x")[:-1]:
            size *= int(dim)
        largest = max(largest, size)
    return largest


def scratch_compiler_options(lowered, backend: str) -> dict[str, int]:
    """XLA options for compiling ``lowered`` on ``backend``: on the CPU, its scratch in blocks of at most
    :data:`SCRATCH_BLOCK_BYTES` (``xla_multiheap_size_constraint_per_heap``), unless an array of the program is
    larger than that (XLA would warn of each such array, many times a compilation, and map it afresh at every call
    whatever the block size)."""
    if backend != "cpu" or largest_array_bytes(lowered.as_text()) > SCRATCH_BLOCK_BYTES:
        return {}
    return {_MULTIHEAP: SCRATCH_BLOCK_BYTES}


def compile_program(lowered, *, loop_free: bool = False):
    """``lowered.compile()`` with :func:`scratch_compiler_options` for the default backend: a large scratch served
    from malloc's heaps, without page faults, on whichever thread runs the program.

    ``loop_free``: the program runs no long loop (a train step of one micro-batch), so in the tuned environment of
    several devices, which leaves YNNPACK's fusions on (module docstring), they are switched off for it as on one.
    """
    import jax

    options = scratch_compiler_options(lowered, jax.default_backend())
    if loop_free and jax.default_backend() == "cpu" and jax.device_count() > 1 and in_tuned_environment() \
            and "xla_cpu_experimental_ynn_fusion_type" not in os.environ.get("XLA_FLAGS", ""):
        options[NO_YNN_FUSION.strip("-=")] = ""
    return lowered.compile(options or None)


def in_tuned_environment() -> bool:
    """Whether this process runs with the settings `tuned_environment` makes (the `jaxformer` command's, its sweep
    workers'), not as a library in a process of its user's."""
    return os.environ.get("JAXFORMER_TUNE") != "0" and tuned_environment(os.environ) == dict(os.environ)


_started_runs = 0


def process_startup_s() -> float:
    """Seconds from this process's start to now the first time it is asked (its first run), 0 after."""
    global _started_runs
    _started_runs += 1
    if _started_runs > 1:
        return 0.0
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


# JAX's persistent compilation cache: compiled programs kept on disk for later processes.
COMPILATION_CACHE = "~/.cache/jaxformer/xla"  # the default of train.compilation_cache too
CACHE_DIR_ENV = "JAXFORMER_CACHE_DIR"


def enable_compilation_cache(directory: str | os.PathLike | None = None) -> Path | None:
    """Turns on JAX's persistent compilation cache in ``directory``; returns it, or None when off.

    ``None`` reads ``$JAXFORMER_CACHE_DIR``, else :data:`COMPILATION_CACHE`; an empty string turns
    the cache off. Every program is kept, however fast it compiled. JAX opens the cache at the
    first compilation that looks for it, once per process: a directory given after that is not
    used. What the cache holds runs as native code (and `jaxformer.scaling.programs` unpickles its
    entries), so a directory another user owns or every user may write is left unused, with a note.

    Programs with ``custom_partitioning`` calls (multi-device steps with the fused attention or the oneDNN matmul)
    are keyed without the calls' Python addresses, so that another process finds them; another library's
    custom-partitioned calls in this process must then carry their own static arguments into the program, as
    `jaxformer.functional.partition_key` does for jaxformer's.
    """
    if directory is None:
        directory = os.environ.get(CACHE_DIR_ENV, COMPILATION_CACHE)
    if not str(directory):
        return None
    import jax

    from jaxformer.files import others_may_write

    path = Path(directory).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    whose = others_may_write(path)
    if whose is not None:
        print(f"note: compilation cache {path} is {whose}, so its programs could be anyone's: not used (give "
              f"train.compilation_cache or ${CACHE_DIR_ENV} a directory only you can write)", file=sys.stderr)
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    # a custom-partitioned call's address, new in every process, left out of the key: jaxformer's own calls carry
    # what their partitioning depends on instead (`jaxformer.functional.partition_key`)
    jax.config.update("jax_remove_custom_partitioning_ptr_from_cache_key", True)
    return path
