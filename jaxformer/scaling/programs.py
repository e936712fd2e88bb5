"""Compiled solver programs kept on disk, so that a later process skips tracing and lowering too.

JAX's persistent compilation cache (``jaxformer fit`` turns it on: ``$JAXFORMER_CACHE_DIR``,
default ``~/.cache/jaxformer/xla``) keys an executable by the lowered program, so a process
must first trace and lower the solver before it can look the executable up — a good part of a
warm fit's time (docs/fit-speed.md). ``load_or_compile`` keys it instead by what the program is
made from: the source files that define it, the versions of JAX and jaxlib, the argument shapes and
dtypes, the static arguments, the devices, ``XLA_FLAGS``, JAX's tracing settings and the CPU.
The serialized executable is kept in the same directory as JAX's entries (nothing is written
while that cache is off), under ``jaxformer-<key>.exe``; an entry that cannot be loaded is
compiled afresh and rewritten. Like JAX's own cache, an entry is native code for this machine:
the directory must be one only its owner can write.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import pickle
from pathlib import Path
from typing import Any, Callable, Sequence

import jax

from jaxformer.files import write_bytes_atomic

FORMAT = "jaxformer-programs-1"
INERT_OPTION = {"xla_embed_ir_in_executable": False}  # XLA's default: the same code, another key in JAX's cache
_LOADED: dict[str, Any] = {}  # key -> compiled program, for later calls in this process
_HITS: list[int] = []
_log = logging.getLogger(__name__)


def cache_directory() -> Path | None:
    """JAX's persistent compilation cache directory, or None while that cache is off."""
    directory = jax.config.jax_compilation_cache_dir
    return Path(directory) if directory and jax.config.jax_enable_compilation_cache else None


def load_or_compile(lower: Callable[[], Any], args: Any, *, parts: Sequence[str], sources: Sequence[str],
                    devices: Sequence[Any]) -> Any | None:
    """The compiled program ``lower().compile()`` (a ``jax.stages.Compiled`` taking ``args``' structure), from
    this process, then from the cache directory, else compiled and stored; None while the cache is off.

    ``parts`` are strings that identify the program besides ``sources`` (the files whose code it runs: a
    change to any of them makes a new key) and ``args``' shapes; ``devices`` are those it runs on.
    """
    directory = cache_directory()
    key = _key(args, parts, sources, devices) if directory else None
    if key is None:
        return None
    if key in _LOADED:
        return _LOADED[key]
    path = directory / f"jaxformer-{key}.exe"
    compiled = _load(path, devices)
    if compiled is None:
        lowered, hits = lower(), _cache_hits()
        compiled = lowered.compile()
        if _cache_hits() > hits:
            # JAX's cache held it, and XLA:CPU cannot serialize an executable it loaded: compile it afresh once,
            # under an inert option (it changes JAX's key, not the code), so that later processes load this one
            hits = _cache_hits()
            try:
                compiled = lowered.compile(INERT_OPTION)
            except Exception as error:  # noqa: BLE001 - keep the loaded one, store nothing
                _log.warning("could not recompile program %s to store it: %s", path.name, error)
                hits = -1
        if _cache_hits() == hits:  # compiled here, so its serialization loads
            _store(path, compiled)
    _LOADED[key] = compiled
    return compiled


def _cache_hits() -> int:
    """Executables JAX has taken from its persistent cache in this process so far."""
    if not _HITS:
        _HITS.append(0)

        def count(event: str, **_) -> None:
            if event == "/jax/compilation_cache/cache_hits":
                _HITS[0] += 1

        jax.monitoring.register_event_listener(count)
    return _HITS[0]


def _plain(value: Any) -> Any:
    """A value reduced to what repr prints the same in every process (objects by their type's name)."""
    if value is None or isinstance(value, (bool, int, float, str, enum.Enum)):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return type(value).__name__


def _cpu() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        return platform.processor()
    first = lambda name: next((line for line in lines if line.startswith(name)), "")  # noqa: E731
    return first("model name") + first("flags")


def _key(args: Any, parts: Sequence[str], sources: Sequence[str], devices: Sequence[Any]) -> str | None:
    try:
        import jaxlib
        from jax._src.config import trace_context

        context = repr(_plain(trace_context()))
        contents = [Path(source).read_bytes() for source in sources]
    except (ImportError, OSError, AttributeError) as error:  # a program without a stable key: not stored
        _log.debug("no key for a stored program: %s", error)
        return None
    leaves = jax.tree.leaves(args)
    text = [FORMAT, jax.__version__, jaxlib.__version__, *parts, str(jax.tree.structure(args)),
            repr([(tuple(a.shape), str(a.dtype)) for a in leaves]),
            repr([(d.platform, d.device_kind, d.id) for d in devices]), str(jax.local_device_count()),
            os.environ.get("XLA_FLAGS", ""), context, _cpu()]
    digest = hashlib.sha256()
    for chunk in [t.encode() for t in text] + contents:
        digest.update(len(chunk).to_bytes(8, "little"))
        digest.update(chunk)
    return digest.hexdigest()[:48]


def _load(path: Path, devices: Sequence[Any]) -> Any | None:
    try:
        payload = path.read_bytes()
    except OSError:
        return None
    try:
        from jax.experimental.serialize_executable import deserialize_and_load

        executable, in_tree, out_tree = pickle.loads(payload)
        return deserialize_and_load(executable, in_tree, out_tree, execution_devices=list(devices))
    except Exception as error:  # noqa: BLE001 - a damaged or foreign entry is compiled afresh
        _log.warning("ignoring stored program %s: %s", path.name, error)
        return None


def _store(path: Path, compiled: Any) -> None:
    try:
        from jax.experimental.serialize_executable import serialize

        write_bytes_atomic(path, pickle.dumps(serialize(compiled)))
    except Exception as error:  # noqa: BLE001 - an unwritable cache costs the next process a compile, no more
        _log.warning("could not store program %s: %s", path.name, error)
