"""bf16 and fp32 matmuls through oneDNN (``jaxformer/csrc/onednn_matmul.cc``), called through ``jax.ffi``.

XLA:CPU computes a bf16 dot by converting to fp32 (slower than its own fp32 dot); oneDNN's matmul
primitive uses the CPU's bf16 units (AVX512_BF16 dot products, AMX tiles), as PyTorch's bf16
autocast does, and its fp32 kernels (those PyTorch's own oneDNN uses) beat XLA:CPU's dot on some
shapes and CPUs. :func:`matmul` is ``jnp.matmul(x, w, preferred_element_type=out_dtype)`` of
``x [N, I]`` and ``w [I, O]`` (`jaxformer.functional.dense`'s flattened operands), both bf16 or both fp32,
with fp32 accumulation; its gradient (a ``jax.custom_vjp``) is two more calls on the same kernel, whose
transposes are strides, not copies.

Requires the ``onednn`` extra (``pip install 'jaxformer[onednn]'``: oneDNN's library and headers from
PyPI); the kernel is compiled on first use (`jaxformer.functional.extension`), and
``$JAXFORMER_ONEDNN_MATMUL_LIB`` names a prebuilt library instead. Where it cannot be built or
loaded, :func:`onednn_available` is False, one warning says why, and ``dense(..., impl="onednn")``
computes with ``jnp.matmul``; so does it for a dtype oneDNN has no matmul for on this CPU
(:func:`unsupported_reason`: bf16 needs bf16-capable instructions, which an AVX2-only CPU lacks).

Sharding: each call is wrapped in ``custom_partitioning`` with the rule ``rows inner, inner cols -> rows cols``:
``rows`` and ``cols`` keep their shardings, and a sharded contraction ``inner`` (the weight gradient's
``B·T`` under data parallelism, a row-parallel weight under tensor parallelism) is summed locally in
fp32 and then ``psum``-ed over its mesh axes.

Transforms: under ``jax.vmap`` a mapped input against one weight is one call on the folded rows, any other
mapping one call per entry (``lax.map``). A gradient can be differentiated again (grad of grad, jvp of grad):
each call's own derivatives are ``jnp.matmul``'s. Forward mode of :func:`matmul` itself (``jax.jvp``,
``jax.jacfwd``) raises ``TypeError`` (JAX has none for a ``custom_vjp`` function); ``impl="xla"`` gives it.
"""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.typing import DTypeLike

from jaxformer.functional.extension import Extension
from jaxformer.functional.partition_key import partitioning_key

LIBRARY_ENV = "JAXFORMER_ONEDNN_MATMUL_LIB"
TARGET = "jaxformer_onednn_matmul"
RUNTIME_PACKAGE, HEADERS_PACKAGE = "onednn-cpu-gomp", "onednn-devel-cpu-gomp"


def _package_file(package: str, name: str) -> Path:
    """The installed file ``name`` (a path suffix) of ``package``; raises ``RuntimeError`` saying what to install."""
    try:
        files = importlib.metadata.distribution(package).files or ()
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"{package} is not installed (pip install 'jaxformer[onednn]')") from None
    for file in files:
        if str(file).replace("\\", "/").endswith(name):
            return Path(file.locate()).resolve()
    raise RuntimeError(f"{package} has no {name}")


def _link_flags() -> tuple[str, ...]:
    lib_dir = _package_file(RUNTIME_PACKAGE, "libdnnl.so").parent
    include_dir = _package_file(HEADERS_PACKAGE, "oneapi/dnnl/dnnl.hpp").parents[2]
    return ("-fopenmp", "-isystem", str(include_dir), "-L", str(lib_dir), "-ldnnl", f"-Wl,-rpath,{lib_dir}")


EXTENSION = Extension("onednn_matmul", abi_version=4, library_env=LIBRARY_ENV, description="the oneDNN matmul",
                      targets={TARGET: "JaxformerOnednnMatmul"}, link_flags=_link_flags)
onednn_available = EXTENSION.available
unavailable_reason = EXTENSION.unavailable_reason
loaded_path = EXTENSION.loaded_path


OPERAND_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))


def _result_ok(operand_dtype, out_dtype) -> bool:
    """fp32 results from either operand dtype, bf16 results from bf16 operands only."""
    out_dtype = jnp.dtype(out_dtype)
    return out_dtype == jnp.float32 or (out_dtype == jnp.bfloat16 and jnp.dtype(operand_dtype) == jnp.bfloat16)


@functools.cache
def _cpu_has(operand_dtype: jnp.dtype) -> bool:
    """Whether oneDNN builds every product :func:`matmul` and its gradient make from ``operand_dtype``."""
    probe = EXTENSION.library().jaxformer_onednn_matmul_supports
    src_f32 = int(operand_dtype == jnp.float32)
    return all(probe(src_f32, int(out_dtype == jnp.float32)) for out_dtype in OPERAND_DTYPES
               if _result_ok(operand_dtype, out_dtype))


def unsupported_reason(operand_dtype: DTypeLike) -> str | None:
    """Why :func:`matmul` cannot multiply ``operand_dtype`` (bf16 or fp32) operands here, ``None`` when it can;
    builds the kernel if needed."""
    operand_dtype = jnp.dtype(operand_dtype)
    if operand_dtype not in OPERAND_DTYPES:
        return f"oneDNN matmul operands must be bfloat16 or float32, got {operand_dtype}"
    if not onednn_available():
        return f"the oneDNN matmul is unavailable: {unavailable_reason()}"
    if not _cpu_has(operand_dtype):
        return f"oneDNN has no {operand_dtype} matmul for this CPU's instruction set"
    return None


def supports(x: jax.Array, w: jax.Array, out_dtype: DTypeLike) -> bool:
    """Whether :func:`matmul` computes ``x @ w`` as ``out_dtype`` (2-D, both bf16 or both fp32, a result type
    that :func:`matmul` takes, on a CPU where oneDNN multiplies that dtype); builds the kernel if needed."""
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        return False
    if jnp.dtype(x.dtype) != jnp.dtype(w.dtype) or jnp.dtype(x.dtype) not in OPERAND_DTYPES:
        return False
    if not _result_ok(x.dtype, out_dtype) or jax.default_backend() != "cpu":
        return False
    return unsupported_reason(x.dtype) is None

# oneDNN threads per call. With two or more, its bf16 matmul's sums came out in varying order from call to call
# (a test training the same run twice in one process saw 0.1-0.3% apart), which would break bit-identical
# resume; one thread is deterministic, and `jaxformer train`'s mesh of one device per core gives one anyway.
THREADS = 1


def _ffi(a, b, trans_a: bool, trans_b: bool, out_dtype):
    rows = a.shape[1] if trans_a else a.shape[0]
    cols = b.shape[0] if trans_b else b.shape[1]
    return jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((rows, cols), out_dtype))(
        a, b, trans_a=np.int64(trans_a), trans_b=np.int64(trans_b), threads=np.int64(THREADS))


def _axes(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


@functools.cache
def _partitioned(trans_a: bool, trans_b: bool, out_dtype):
    """``_ffi`` with fixed transposes and result dtype, split over a mesh by the module docstring's rule, with a vmap
    rule (:func:`_vmappable`) and ``jnp.matmul``'s derivatives (:func:`_differentiable`)."""
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding, PartitionSpec

    # factors named in words: a call is x·w, dy·wᵀ or xᵀ·dy, so its rows, columns and contraction are no one axis
    a_factors = ("inner", "rows") if trans_a else ("rows", "inner")
    b_factors = ("cols", "inner") if trans_b else ("inner", "cols")

    def call(a, b):
        return _ffi(a, b, trans_a, trans_b, out_dtype)

    wrapped = custom_partitioning(call)

    def factor_axes(shape, factors) -> dict[str, tuple[str, ...]]:
        """The mesh axes each factor of an operand is sharded over."""
        sharding = shape.sharding
        spec = sharding.spec if isinstance(sharding, NamedSharding) else PartitionSpec()
        return {name: _axes(entry) for name, entry in zip(factors, (*spec, None, None))}

    def layout(mesh, arg_shapes):
        """``(axes of rows, of cols, of inner)``: rows from a, cols and (failing a's) inner from b; no mesh axis
        used twice."""
        a, b = factor_axes(arg_shapes[0], a_factors), factor_axes(arg_shapes[1], b_factors)
        rows = a["rows"]
        cols = tuple(axis for axis in b["cols"] if axis not in rows)
        inner = tuple(axis for axis in a["inner"] or b["inner"] if axis not in rows + cols)
        return rows, cols, inner

    def spec(mesh, factors, axes):
        return NamedSharding(mesh, PartitionSpec(*(axes[name] or None for name in factors)))

    def infer(mesh, arg_shapes, result_shape):
        rows, cols, _ = layout(mesh, arg_shapes)
        return spec(mesh, ("rows", "cols"), {"rows": rows, "cols": cols})

    def partition(mesh, arg_shapes, result_shape):
        rows, cols, inner = layout(mesh, arg_shapes)
        axes = {"rows": rows, "cols": cols, "inner": inner}

        def lower(a, b):
            if not inner:
                return call(a, b)
            partial = _ffi(a, b, trans_a, trans_b, jnp.float32)  # summed across devices in fp32
            return jax.lax.psum(partial, inner).astype(out_dtype)

        operands = (spec(mesh, a_factors, axes), spec(mesh, b_factors, axes))
        return mesh, lower, spec(mesh, ("rows", "cols"), axes), operands

    rule = f"{' '.join(a_factors)}, {' '.join(b_factors)} -> rows cols"
    wrapped.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                          reduction_factors=("inner",))

    def keyed(a, b):
        statics = f"trans_a={trans_a} trans_b={trans_b} out_dtype={jnp.dtype(out_dtype)} threads={THREADS}"
        with partitioning_key(__file__, f"onednn matmul {statics}"):
            return wrapped(a, b)

    return _differentiable(_vmappable(keyed, trans_a), trans_a, trans_b, out_dtype)


def _vmappable(call, trans_a: bool) -> custom_vmap:
    """``call(a, b)`` (2-D operands) with a ``jax.vmap`` rule: where only ``a``'s rows are mapped (a batch of inputs
    against one weight), one call on the mapped axis folded into the rows; otherwise one call per mapped entry
    (``lax.map``). Either computes each output entry's own sum (to rounding: oneDNN may block a larger call
    differently)."""
    @custom_vmap
    def batchable(a, b):
        return call(a, b)

    @batchable.def_vmap
    def rule(axis_size, in_batched, a, b):
        a_batched, b_batched = in_batched
        if a_batched and not b_batched and not trans_a:
            out = batchable(a.reshape(axis_size * a.shape[1], a.shape[2]), b)
            return out.reshape(axis_size, a.shape[1], out.shape[1]), True
        return jax.lax.map(lambda i: batchable(a[i] if a_batched else a, b[i] if b_batched else b),
                           jnp.arange(axis_size)), True

    return batchable


def _differentiable(call, trans_a: bool, trans_b: bool, out_dtype):
    """``call(a, b)`` whose derivatives are ``jnp.matmul``'s (the plain path's): what a second derivative of
    :func:`matmul`, or a forward-mode one of its gradient, takes."""
    @jax.custom_jvp
    def product(a, b):
        return call(a, b)

    @product.defjvp
    def jvp(operands, tangents):
        def reference(a, b):
            return jnp.matmul(a.T if trans_a else a, b.T if trans_b else b, preferred_element_type=out_dtype)
        return product(*operands), jax.jvp(reference, operands, tangents)[1]

    return product


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(x, w, out_dtype):
    return _partitioned(False, False, out_dtype)(x, w)


def _matmul_fwd(x, w, out_dtype):
    return _partitioned(False, False, out_dtype)(x, w), (x, w)


def _matmul_bwd(out_dtype, residuals, dy):
    x, w = residuals
    dy = dy.astype(x.dtype)
    dx = _partitioned(False, True, x.dtype)(dy, w)  # dy·wᵀ
    dw = _partitioned(True, False, x.dtype)(x, dy)  # xᵀ·dy
    return dx, dw


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul(x: jax.Array, w: jax.Array, out_dtype: DTypeLike = jnp.bfloat16) -> jax.Array:
    """``x @ w`` by oneDNN; the caller checks :func:`supports` first.

    Args:
      x: ``[N, I]`` bf16 or fp32.
      w: ``[I, O]`` of ``x``'s dtype.
      out_dtype: ``bfloat16`` (bf16 operands only) or ``float32``; the sums are fp32 either way.

    Returns ``[N, O]`` of ``out_dtype``; the gradients have the operands' dtype, as ``jnp.matmul``'s.
    Raises ``ValueError`` for another ``out_dtype``, and where oneDNN has no matmul for ``x``'s dtype on this CPU
    (:func:`unsupported_reason`).
    """
    out_dtype = jnp.dtype(out_dtype)
    if not _result_ok(x.dtype, out_dtype):
        raise ValueError(f"onednn matmul: out_dtype must be float32, or bfloat16 from bf16 operands, got {out_dtype} "
                         f"from {jnp.dtype(x.dtype)}")
    reason = unsupported_reason(x.dtype)
    if reason is not None:
        raise ValueError(f"onednn matmul: {reason}")
    return _matmul(x, w, out_dtype)
