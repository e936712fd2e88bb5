"""Fused attention for XLA:CPU: a small C++ kernel (``jaxformer/csrc/fused_attention.cc``) called through ``jax.ffi``.

FlashAttention-2's algorithm on one CPU thread per call: the forward walks 64-key tiles with an
online softmax and writes the output and the row log-sum-exp; the backward (a
``jax.custom_vjp``) recomputes each tile's probabilities from that log-sum-exp and writes dq,
dk, dv. No ``T × S`` array is ever written, neither the scores nor the softmax or its gradient,
which on XLA:CPU are separate single-threaded loops over the whole score matrix.

Scope: fp32 q, k, v ``[B, T, H, D]`` / ``[B, S, K, D]`` (``H % K == 0``, ``D <= 128``, values'
head dim equal to the keys'), causal or not, a static ``q_offset >= 0``, any scale. Everything else
(masks from key lengths, windows, ALiBi and T5 biases, other dtypes, a traced offset, other
backends) is left to the plain path by :func:`jaxformer.functional.attention`.

Build: the kernel is compiled on first use, with ``$CXX`` (default ``g++``) against
``jax.ffi.include_dir()``, into ``$JAXFORMER_EXT_CACHE`` (default ``~/.cache/jaxformer/ext``) under
a name keyed by the source, the jaxlib version, the compiler and the CPU's flags, so an upgrade
of jaxlib or a different machine builds afresh; the library is written to a temporary name and
renamed, so concurrent processes never load a half-written file.
``$JAXFORMER_FUSED_ATTENTION_LIB`` names a prebuilt library to load instead (no build). If the
build or the load fails, :func:`fused_available` is False, one warning says why
(:func:`unavailable_reason`), and ``impl="fused"`` computes with the plain path.

Sharding: both calls are wrapped in ``custom_partitioning`` so that a data-parallel ``jit``
runs them on each device's share of the batch (without it XLA gathers the whole batch onto
every device). Its partition callback is keyed by an object id in the lowered program, so on
a multi-device mesh the persistent compilation cache misses on every new process; one device
lowers the FFI calls directly and caches as usual.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.functional.dot_product import validate_qkv

SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "fused_attention.cc"
LIBRARY_ENV = "JAXFORMER_FUSED_ATTENTION_LIB"
CACHE_ENV = "JAXFORMER_EXT_CACHE"
ABI_VERSION = 1  # jaxformer_fused_attention_version() of the source
MAX_HEAD_DIM = 128
FORWARD_TARGET = "jaxformer_fused_attention_fwd"
BACKWARD_TARGET = "jaxformer_fused_attention_bwd"
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
ARCH_FLAGS = ("-march=native",)

_lock = threading.Lock()
_state: dict = {"tried": False, "available": False, "reason": None, "path": None}


def _cpu_flags() -> str:
    """The CPU's feature flags (``-march=native`` compiles for them), '' where /proc/cpuinfo is absent."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str:
    return os.environ.get("CXX", "g++")


def library_path() -> Path:
    """Where the kernel built for this source, jaxlib, compiler and CPU lives (it may not exist yet)."""
    import jaxlib

    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), jaxlib.__version__.encode(), _compiler().encode(), " ".join(FLAGS).encode(),
                 platform.machine().encode(), _cpu_flags().encode()):
        key.update(part)
        key.update(b"\0")
    cache = Path(os.environ.get(CACHE_ENV, "~/.cache/jaxformer/ext")).expanduser()
    return cache / f"fused_attention-{key.hexdigest()[:16]}.so"


def build(path: Path) -> Path:
    """Compiles the kernel to ``path`` (atomically); raises ``RuntimeError`` with the compiler's message."""
    compiler = _compiler()
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler: {compiler!r} is not on PATH (set CXX)")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp.so", dir=path.parent)
    os.close(handle)
    errors = []
    try:
        for arch in (ARCH_FLAGS, ()):  # -march=native first; a compiler without it gets the baseline ISA
            command = [compiler, *FLAGS, *arch, "-isystem", jax.ffi.include_dir(), str(SOURCE), "-o", temporary]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode == 0:
                os.replace(temporary, path)
                return path
            errors.append(f"{' '.join(command)}: {result.stderr.strip()[-2000:]}")
        raise RuntimeError("compiling the fused attention kernel failed:\n" + "\n".join(errors))
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _load() -> None:
    if os.environ.get(LIBRARY_ENV):
        path = Path(os.environ[LIBRARY_ENV])
    else:
        path = library_path()
        if not path.exists():
            build(path)
    _state["path"] = str(path)
    library = ctypes.cdll.LoadLibrary(str(path))  # OSError when missing or not a library
    version = library.jaxformer_fused_attention_version()
    if version != ABI_VERSION:
        raise RuntimeError(f"{path} is version {version} of the kernel, this jaxformer needs {ABI_VERSION}")
    for target, symbol in ((FORWARD_TARGET, library.JaxformerAttentionForward),
                           (BACKWARD_TARGET, library.JaxformerAttentionBackward)):
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol), platform="cpu")
        # every operand and result leads with the batch axis: a data-parallel mesh splits the call by batch
        jax.ffi.register_ffi_target_as_batch_partitionable(target)


def fused_available() -> bool:
    """Whether the fused kernel is built and registered (building it on the first call); warns once if not."""
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            try:
                _load()
                _state["available"] = True
            except Exception as error:  # any failure leaves the plain path in charge
                _state["reason"] = f"{type(error).__name__}: {error}"
                warnings.warn(f"fused attention is unavailable, attention_impl='fused' uses the plain path: "
                              f"{_state['reason']}", RuntimeWarning, stacklevel=3)
    return _state["available"]


def unavailable_reason() -> str | None:
    """Why the kernel could not be loaded (``None`` when it is, or before :func:`fused_available` ran)."""
    return _state["reason"]


def loaded_path() -> str | None:
    """The library the kernel was (or was to be) loaded from."""
    return _state["path"]


def supports(q, k, v, *, q_offset=0, key_lengths=None, window=None, alibi_slopes=None, relative_bias=None,
             scale=None) -> bool:
    """Whether the fused kernel computes this call (else the plain path does); builds the kernel if needed."""
    if scale is not None and not isinstance(scale, (int, float, np.number)):
        return False  # a traced scale
    if q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim:
        return False  # the plain path raises the shape error
    if any(x is not None for x in (key_lengths, window, alibi_slopes, relative_bias)):
        return False
    if not (isinstance(q_offset, (int, np.integer)) and not isinstance(q_offset, bool) and q_offset >= 0):
        return False
    if any(jnp.dtype(x.dtype) != jnp.float32 for x in (q, k, v)):
        return False
    if k.shape[-1] != v.shape[-1] or q.shape[-1] != k.shape[-1] or q.shape[-1] > MAX_HEAD_DIM or k.shape[-3] == 0:
        return False
    if jax.default_backend() != "cpu":
        return False
    return fused_available()


def _attrs(scale: float, causal: bool, q_offset: int) -> dict:
    return {"scale": np.float32(scale), "causal": np.int64(causal), "q_offset": np.int64(q_offset)}


def _forward_ffi(q, k, v, scale, causal, q_offset):
    B, T, H, _ = q.shape
    out_types = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct((B, H, T), jnp.float32))
    return tuple(jax.ffi.ffi_call(FORWARD_TARGET, out_types, vmap_method="sequential")(
        q, k, v, **_attrs(scale, causal, q_offset)))


def _backward_ffi(q, k, v, out, d_out, lse, scale, causal, q_offset):
    grad_types = tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (q, k, v))
    return tuple(jax.ffi.ffi_call(BACKWARD_TARGET, grad_types, vmap_method="sequential")(
        q, k, v, out, d_out, lse, **_attrs(scale, causal, q_offset)))


def _split_by_batch(ffi_fn, num_arrays: int, rule: str):
    """``ffi_fn`` run on each device's share of the batch under a sharded ``jit``.

    XLA would otherwise gather every operand onto each device (the custom call has no
    partitioner): the rule tells Shardy that only the leading batch axis may stay sharded, and
    the partition callback runs the kernel on each shard (other axes are gathered first).
    """
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding, PartitionSpec

    statics = tuple(range(num_arrays, num_arrays + 3))
    wrapped = custom_partitioning(ffi_fn, static_argnums=statics)

    def shardings(mesh, arg_shapes, shapes):
        first = arg_shapes[0].sharding
        spec = first.spec if isinstance(first, NamedSharding) else PartitionSpec()
        batch = spec[0] if len(spec) else None
        return tuple(NamedSharding(mesh, PartitionSpec(batch, *(None,) * (len(x.shape) - 1))) for x in shapes)

    def infer(scale, causal, q_offset, mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes, result_shape)

    def partition(scale, causal, q_offset, mesh, arg_shapes, result_shape):
        def lower(*arrays):
            return ffi_fn(*arrays, scale, causal, q_offset)
        return mesh, lower, shardings(mesh, arg_shapes, result_shape), shardings(mesh, arg_shapes, arg_shapes)

    # every factor but the batch, in order of first appearance (Shardy wants them sorted by index)
    factors = tuple(name for name in dict.fromkeys(rule.replace("->", " ").replace(",", " ").split()) if name != "b")
    wrapped.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                          need_replication_factors=factors)
    return wrapped


_forward_call = _split_by_batch(_forward_ffi, 3, "b t h d, b s k d, b s k d -> b t h d, b h t")
_backward_call = _split_by_batch(
    _backward_ffi, 6, "b t h d, b s k d, b s k e, b t h e, b t h e, b h t -> b t h d, b s k d, b s k e")


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _fused(q, k, v, scale, causal, q_offset):
    return _forward_call(q, k, v, scale, causal, q_offset)[0]


def _fused_fwd(q, k, v, scale, causal, q_offset):
    out, lse = _forward_call(q, k, v, scale, causal, q_offset)
    return out, (q, k, v, out, lse)


def _fused_bwd(scale, causal, q_offset, residuals, d_out):
    q, k, v, out, lse = residuals
    return _backward_call(q, k, v, out, d_out.astype(jnp.float32), lse, scale, causal, q_offset)


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_attention(q, k, v, *, causal: bool = False, q_offset: int = 0, scale: float | None = None) -> jax.Array:
    """``softmax(q·kᵀ·scale)·v`` by the fused kernel; the caller checks :func:`supports` first.

    Args:
      q: ``[B, T, H, D]`` (or ``[T, H, D]``) fp32 queries; query ``i`` sits at position ``i + q_offset``.
      k, v: ``[B, S, K, D]`` fp32 keys and values; ``H`` a multiple of ``K``.
      causal: keep keys ``j <= i + q_offset``.
      scale: multiplies the scores; defaults to ``1/sqrt(D)``.
    """
    q, k, v, unbatched = validate_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    out = _fused(q, k, v, scale, bool(causal), int(q_offset))
    return out[0] if unbatched else out
