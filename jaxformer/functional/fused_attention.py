"""Fused attention for XLA:CPU: a small C++ kernel (``jaxformer/csrc/fused_attention.cc``) called through ``jax.ffi``.

FlashAttention-2's algorithm on one CPU thread per call: the forward walks 64-key tiles with an
online softmax and writes the output and the row log-sum-exp; the backward (a
``jax.custom_vjp``) recomputes each tile's probabilities from that log-sum-exp and writes dq,
dk, dv. No ``T × S`` array is ever written, neither the scores nor the softmax or its gradient,
which on XLA:CPU are separate single-threaded loops over the whole score matrix.

Scope: fp32 or bf16 q, k, v ``[B, T, H, D]`` / ``[B, S, K, D]`` (``H % K == 0``, ``D <= 128``, values'
head dim equal to the keys'), causal or not, a static ``q_offset >= 0``, any scale. bf16 inputs are
computed in fp32 (as PyTorch's CPU flash attention accumulates bf16 in fp32) and the output and
gradients rounded back to bf16. The kernel's sums are the plain path's to fp32 rounding, which the scale
multiplies in dq and dk: a huge scale (1e3 and more) on a row whose softmax is almost but not quite one key
leaves differences of that order (as between XLA's jitted and eager plain path); a fully saturated row gives
dq and dk below 1e-30 where the plain path gives 0. Everything else (masks from key lengths, windows, ALiBi and T5
biases, other dtypes, a traced offset, other backends) is left to the plain path by
:func:`jaxformer.functional.attention`.

Build: the kernel is compiled on first use (`jaxformer.functional.extension`);
``$JAXFORMER_FUSED_ATTENTION_LIB`` names a prebuilt library to load instead (no build). If the
build or the load fails, :func:`fused_available` is False, one warning says why
(:func:`unavailable_reason`), and ``impl="fused"`` computes with the plain path.

Transforms: under ``jax.vmap`` each call folds the mapped axis into its batch axis (unmapped operands
broadcast) and runs once. The gradient is the backward kernel (a ``jax.custom_vjp``); both calls are
differentiated through plain-JAX transcriptions of what they compute (:func:`_reference_forward`,
:func:`_reference_backward`), so that a gradient can be differentiated again (grad of grad, jvp of grad), with
XLA's score-sized arrays. Forward mode of the attention itself (``jax.jvp``, ``jax.jacfwd``) raises ``TypeError``:
JAX has none for a ``custom_vjp`` function; ``impl="naive"`` or ``"xla"`` give it.

Sharding: both calls are wrapped in ``custom_partitioning`` so that a data-parallel ``jit``
runs them on each device's share of the batch (without it XLA gathers the whole batch onto
every device). Its partition callback is keyed by an object id in the lowered program, so on
a multi-device mesh the persistent compilation cache misses on every new process; one device
lowers the FFI calls directly and caches as usual.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from jaxformer.functional.dot_product import validate_qkv
from jaxformer.functional.extension import Extension
from jaxformer.functional.masks import query_key_distance
from jaxformer.functional.partition_key import partitioning_key

LIBRARY_ENV = "JAXFORMER_FUSED_ATTENTION_LIB"
MAX_HEAD_DIM = 128
FORWARD_TARGET = "jaxformer_fused_attention_fwd"
BACKWARD_TARGET = "jaxformer_fused_attention_bwd"
EXTENSION = Extension("fused_attention", abi_version=1, library_env=LIBRARY_ENV, description="fused attention",
                      targets={FORWARD_TARGET: "JaxformerAttentionForward", BACKWARD_TARGET: "JaxformerAttentionBackward"},
                      batch_partitionable=True)  # every operand and result leads with the batch axis
fused_available = EXTENSION.available
unavailable_reason = EXTENSION.unavailable_reason
loaded_path = EXTENSION.loaded_path


def supports(q: jax.Array, k: jax.Array, v: jax.Array, *, q_offset: int | jax.Array = 0,
             key_lengths: jax.Array | None = None, window: int | None = None, alibi_slopes: jax.Array | None = None,
             relative_bias: jax.Array | None = None, scale: float | jax.Array | None = None) -> bool:
    """Whether the fused kernel computes this call (else the plain path does); builds the kernel if needed.

    The arguments are :func:`jaxformer.functional.attention`'s: ``q [B, T, H, D]``, ``k, v [B, S, K, D]`` (or all
    without ``B``). The kernel takes, on a CPU, fp32 or bf16 operands of one dtype, one head dimension
    ``D <= MAX_HEAD_DIM`` for all three, at least one key, a static non-negative ``q_offset`` and a static scale,
    and none of ``key_lengths``, ``window``, ALiBi or a relative bias.
    """
    if scale is not None and not isinstance(scale, (int, float, np.number)):
        return False  # a traced scale
    if q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim:
        return False  # the plain path raises the shape error
    if any(x is not None for x in (key_lengths, window, alibi_slopes, relative_bias)):
        return False
    if not (isinstance(q_offset, (int, np.integer)) and not isinstance(q_offset, bool) and q_offset >= 0):
        return False
    if jnp.dtype(q.dtype) not in (jnp.float32, jnp.bfloat16) or any(x.dtype != q.dtype for x in (k, v)):
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

    def keyed(*args):
        scale, causal, q_offset = args[num_arrays:]
        with partitioning_key(__file__, f"{ffi_fn.__name__} scale={scale!r} causal={causal} q_offset={q_offset}"):
            return wrapped(*args)

    return keyed


def _foldable(call, num_arrays: int):
    """``call(*arrays, scale, causal, q_offset)`` that ``jax.vmap`` runs as one call on a larger batch.

    The rule broadcasts the unmapped operands, folds the mapped axis into the leading batch axis that every
    operand and result has, calls the kernel once and unfolds the results: exact, as batch entries never mix.
    """
    @functools.cache
    def with_statics(scale: float, causal: bool, q_offset: int) -> custom_vmap:
        @custom_vmap
        def run(*arrays):
            return call(*arrays, scale, causal, q_offset)

        @run.def_vmap
        def fold(axis_size, in_batched, *arrays):
            arrays = [x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))
                      for x, batched in zip(arrays, in_batched)]
            batch = arrays[0].shape[1]  # recorded, not divided out of the result: the mapped axis may be empty
            outs = run(*(x.reshape(axis_size * x.shape[1], *x.shape[2:]) for x in arrays))
            return tuple(y.reshape(axis_size, batch, *y.shape[1:]) for y in outs), (True,) * len(outs)

        return run

    return lambda *args: with_statics(*args[num_arrays:])(*args[:num_arrays])


def _differentiable(call, reference, num_arrays: int):
    """``call(*arrays, scale, causal, q_offset)`` whose derivatives are those of ``reference`` (same arguments,
    same results, in plain JAX): what a second derivative, or a forward-mode one of a gradient, takes."""
    @functools.partial(jax.custom_jvp, nondiff_argnums=tuple(range(num_arrays, num_arrays + 3)))
    def kernel(*args):
        return call(*args)

    @kernel.defjvp
    def jvp(scale, causal, q_offset, arrays, tangents):
        _, tangents_out = jax.jvp(lambda *xs: reference(*xs, scale, causal, q_offset), arrays, tangents)
        return kernel(*arrays, scale, causal, q_offset), tangents_out

    return kernel


def _scores(q, k, scale: float, causal: bool, q_offset: int) -> jax.Array:
    """``[B, K, G, T, S]`` scaled scores of ``q [B, T, H, D]`` (query head ``h = kh·G + g``) and ``k [B, S, K, D]``,
    the keys a causal row does not see at -inf."""
    B, T, H, D = q.shape
    S, K = k.shape[1], k.shape[2]
    scores = jnp.einsum("btkgd,bskd->bkgts", q.reshape(B, T, K, H // K, D), k) * scale
    if not causal:
        return scores
    return jnp.where(query_key_distance(T, S, q_offset) >= 0, scores, -jnp.inf)


def _reference_forward(q, k, v, scale, causal, q_offset):
    """The forward kernel's ``(out [B, T, H, D], lse [B, H, T])`` in plain JAX."""
    B, T, H, _ = q.shape
    scores = _scores(q, k, scale, causal, q_offset)
    lse = jax.nn.logsumexp(scores, axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", jnp.exp(scores - lse[..., None]), v)
    return out.reshape(B, T, H, v.shape[-1]), lse.reshape(B, H, T)


def _reference_backward(q, k, v, out, d_out, lse, scale, causal, q_offset):
    """The backward kernel's ``(dq, dk, dv)`` in plain JAX, from the same operands (``Δ = rowsum(dO∘O)``)."""
    B, T, H, D = q.shape
    K = k.shape[2]
    p = jnp.exp(_scores(q, k, scale, causal, q_offset) - lse.reshape(B, K, H // K, T)[..., None])
    q, out, d_out = (x.reshape(B, T, K, H // K, x.shape[-1]) for x in (q, out, d_out))
    delta = jnp.einsum("btkgd,btkgd->bkgt", d_out, out)
    d_scores = p * (jnp.einsum("btkgd,bskd->bkgts", d_out, v) - delta[..., None]) * scale
    dq = jnp.einsum("bkgts,bskd->btkgd", d_scores, k).reshape(B, T, H, D)
    return dq, jnp.einsum("bkgts,btkgd->bskd", d_scores, q), jnp.einsum("bkgts,btkgd->bskd", p, d_out)


def _kernel_call(ffi_fn, reference, num_arrays: int, rule: str):
    """``ffi_fn(*arrays, scale, causal, q_offset)`` split by batch over a mesh, one call under ``jax.vmap``, and
    differentiated as ``reference``."""
    return _differentiable(_foldable(_split_by_batch(ffi_fn, num_arrays, rule), num_arrays), reference, num_arrays)


_forward_call = _kernel_call(_forward_ffi, _reference_forward, 3, "b t h d, b s k d, b s k d -> b t h d, b h t")
_backward_call = _kernel_call(
    _backward_ffi, _reference_backward, 6,
    "b t h d, b s k d, b s k d, b t h d, b t h d, b h t -> b t h d, b s k d, b s k d")


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


def fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False, q_offset: int = 0,
                    scale: float | None = None) -> jax.Array:
    """``softmax(q·kᵀ·scale)·v`` by the fused kernel; the caller checks :func:`supports` first.

    Args:
      q: ``[B, T, H, D]`` (or ``[T, H, D]``) fp32 or bf16 queries; query ``i`` sits at position ``i + q_offset``.
      k, v: ``[B, S, K, D]`` keys and values of q's dtype; ``H`` a multiple of ``K``.
      causal: keep keys ``j <= i + q_offset``.
      scale: multiplies the scores; defaults to ``1/sqrt(D)``.
    """
    q, k, v, unbatched = validate_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    dtype = q.dtype
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))  # no-ops for fp32; bf16 computes in fp32
    out = _fused(q, k, v, scale, bool(causal), int(q_offset)).astype(dtype)
    return out[0] if unbatched else out
