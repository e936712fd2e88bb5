"""One attention entry point over four implementations, chosen by ``impl`` (a run's ``kernel.attention_impl``).

- ``naive``: :func:`~jaxformer.functional.dot_product.dot_product_attention` with the full
  ``[B, H, T, S]`` mask and ALiBi / T5 relative bias built from the structured arguments; the reference.
- ``blockwise``: :func:`~jaxformer.functional.blockwise.blockwise_attention`, exact, in key
  tiles, O(T·block_size) memory in both passes.
- ``xla``: ``jax.nn.dot_product_attention``, given the structured arguments it understands
  (``is_causal``, ``local_window_size``, ``key_value_seq_lengths``) so that a fused backend can
  use them; a nonzero ``q_offset`` falls back to an explicit mask.
- ``fused``: :func:`~jaxformer.functional.fused_attention.fused_attention`, a C++ FlashAttention-2
  kernel for XLA:CPU through ``jax.ffi`` that never writes a score-sized array, for fp32 attention
  without key lengths, windows or biases and with a static ``q_offset``; other calls, and every
  call where the kernel cannot be built (``fused_available()``), take the ``naive`` path. The
  kernel skips the masked tiles itself, so ``query_block_size`` does not apply to it.

All four agree on the semantics: query ``i`` sits at position ``i + q_offset``, key ``j`` at
``j``; rows with no visible key return zeros.

All four work under ``jax.jit``, ``jax.vmap`` and reverse mode to any order (grad of grad). ``blockwise`` and
``fused`` give their gradients by ``jax.custom_vjp``, which JAX cannot differentiate in forward mode:
``jax.jvp`` and ``jax.jacfwd`` of them raise ``TypeError`` (a jvp of their gradient works); forward mode
needs ``naive`` or ``xla``.

Causal self-attention can also be cut into blocks of ``query_block_size`` queries (any
``impl``): each block attends only to the keys up to its last query, so the score tiles above
the diagonal, fully masked, are never computed — ``(n + 1) / 2n`` of the work for ``n``
blocks. The result is the same attention, computed exactly per block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxformer.functional.dot_product import dot_product_attention, validate_qkv
from jaxformer.functional.blockwise import blockwise_attention, check_structured_args
from jaxformer.functional import fused_attention as fused
from jaxformer.functional.masks import attention_mask
from jaxformer.functional.positions import alibi_bias_from_slopes, relative_position_bias
from jaxformer.kernel import IMPLEMENTATIONS


def check_impl(impl: str) -> None:
    """Raises one line unless ``impl`` is an attention implementation a model can be built with (not ``auto``)."""
    if impl == "auto":
        raise ValueError("attention_impl 'auto' is chosen per run by training (jaxformer.train.kernel_choice); "
                         f"a model built directly needs one of {', '.join(IMPLEMENTATIONS)}")
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"attention_impl must be one of {', '.join(IMPLEMENTATIONS)}, got {impl!r}")


def _xla_attention(q_BTHD, k_BSKD, v_BSKD, *, causal, q_offset, key_lengths, window, bias_HTS, scale):
    """``jax.nn.dot_product_attention`` with our semantics: decoding offsets and empty rows → zeros."""
    T, S = q_BTHD.shape[1], k_BSKD.shape[1]
    offset_is_zero = isinstance(q_offset, int) and q_offset == 0
    structured = {}
    mask_B1TS = None
    if offset_is_zero:
        # jax's causal mask is j <= i and its window is (left, right) = (window - 1, 0)
        structured = {"is_causal": causal or window is not None,
                      "local_window_size": None if window is None else (int(window) - 1, 0)}
    else:
        mask_B1TS = attention_mask(T, S, causal=causal, window=window, offset=q_offset)
    out_BTHD = jax.nn.dot_product_attention(
        q_BTHD,
        k_BSKD,
        v_BSKD,
        bias=None if bias_HTS is None else bias_HTS[None],
        mask=mask_B1TS,
        scale=scale,
        key_value_seq_lengths=None if key_lengths is None else jnp.asarray(key_lengths, jnp.int32),
        **structured,
    )
    # jax fills masked scores with a large finite negative, so an empty row averages all values
    visible_B1TS = attention_mask(T, S, causal=causal, window=window, key_lengths=key_lengths, offset=q_offset)
    if visible_B1TS is None:
        return out_BTHD
    row_has_key_BT11 = jnp.any(visible_B1TS, axis=-1)[:, 0, :, None, None]
    return jnp.where(row_has_key_BT11, out_BTHD, 0.0).astype(out_BTHD.dtype)


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    impl: str = "naive",
    causal: bool = False,
    q_offset: int | jax.Array = 0,
    key_lengths: jax.Array | None = None,
    window: int | None = None,
    alibi_slopes: jax.Array | None = None,
    relative_bias: jax.Array | None = None,
    relative_bidirectional: bool = True,
    relative_max_distance: int = 128,
    scale: float | None = None,
    block_size: int = 128,
    query_block_size: int | None = None,
) -> jax.Array:
    """``softmax(q·kᵀ·scale + bias)·v`` by the implementation ``impl`` (naive | blockwise | xla | fused).

    Args:
      q: ``[B, T, H, D]`` queries (or ``[T, H, D]``); query ``i`` sits at position ``i + q_offset``.
      k, v: ``[B, S, K, D]`` keys and values at positions ``0 .. S-1``; ``H`` a multiple of ``K``.
      causal: keep keys ``j <= i + q_offset``.
      q_offset: position of the first query (the cache length when decoding); may be traced.
      key_lengths: ``[B]`` int; keys ``j >= key_lengths[b]`` are padding.
      window: causal sliding window, keys ``0 <= (i + q_offset) - j < window`` (implies causal).
      alibi_slopes: ``[H]``; adds ``-slope_h·|i + q_offset - j|`` after scaling.
      relative_bias: ``[P, H]`` T5 bias table; adds ``relative_bias[bucket(i + q_offset - j), h]``
        after scaling (:func:`~jaxformer.functional.positions.relative_position_bias`, with
        ``relative_bidirectional`` buckets up to ``relative_max_distance``).
      scale: multiplies the scores; defaults to ``1/sqrt(D)``.
      block_size: keys per tile (blockwise only).
      query_block_size: for causal self-attention (``T == S``, ``q_offset == 0``, causal or
        windowed), queries per block, each block attending only to its visible key prefix
        (the last block takes the remainder); ``None`` computes one block. Ignored otherwise.

    Returns ``[B, T, H, D]`` in q's dtype; rows with no visible key are zeros.
    """
    check_impl(impl)
    if query_block_size is not None and int(query_block_size) <= 0:
        raise ValueError(f"query_block_size must be positive or None, got {query_block_size}")
    if q.shape[-3] == 0 or k.shape[-3] == 0:  # no queries, or no keys for any: as jax.nn and PyTorch give
        validate_qkv(q, k, v)
        return jnp.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)
    if impl == "fused":
        if fused.supports(q, k, v, q_offset=q_offset, key_lengths=key_lengths, window=window,
                          alibi_slopes=alibi_slopes, relative_bias=relative_bias, scale=scale):
            return fused.fused_attention(q, k, v, causal=causal, q_offset=int(q_offset), scale=scale)
        impl = "naive"
    T = q.shape[-3]
    causal_self = (causal or window is not None) and isinstance(q_offset, int) and q_offset == 0 and T == k.shape[-3]
    if query_block_size is not None and T > query_block_size and causal_self:
        return _causal_query_blocks(q, k, v, impl=impl, key_lengths=key_lengths, window=window,
                                    alibi_slopes=alibi_slopes, relative_bias=relative_bias,
                                    relative_bidirectional=relative_bidirectional,
                                    relative_max_distance=relative_max_distance, scale=scale,
                                    block_size=block_size, query_block_size=int(query_block_size))
    if impl == "blockwise":
        return blockwise_attention(
            q, k, v, causal=causal, q_offset=q_offset, key_lengths=key_lengths, window=window,
            alibi_slopes=alibi_slopes, relative_bias=relative_bias, relative_bidirectional=relative_bidirectional,
            relative_max_distance=relative_max_distance, scale=scale, block_size=block_size,
        )
    q, k, v, unbatched = validate_qkv(q, k, v)
    check_structured_args(q, key_lengths, window, alibi_slopes, relative_bias)
    T, S = q.shape[1], k.shape[1]
    bias_HTS = attention_bias(T, S, q_offset=q_offset, alibi_slopes=alibi_slopes, relative_bias=relative_bias,
                              relative_bidirectional=relative_bidirectional,
                              relative_max_distance=relative_max_distance)
    if impl == "naive":
        mask_B1TS = attention_mask(T, S, causal=causal, window=window, key_lengths=key_lengths, offset=q_offset)
        out_BTHD = dot_product_attention(q, k, v, mask=mask_B1TS, bias=bias_HTS, scale=scale)
    else:
        out_BTHD = _xla_attention(
            q, k, v, causal=causal, q_offset=q_offset, key_lengths=key_lengths, window=window,
            bias_HTS=bias_HTS, scale=scale,
        )
    return out_BTHD[0] if unbatched else out_BTHD


def attention_bias(q_len: int, k_len: int, *, q_offset: int | jax.Array = 0, alibi_slopes: jax.Array | None = None,
                   relative_bias: jax.Array | None = None, relative_bidirectional: bool = True,
                   relative_max_distance: int = 128) -> jax.Array | None:
    """``[H, q_len, k_len]``: the ALiBi and T5 relative biases :func:`attention` adds to the scaled scores (their
    sum when both are given), None without either; arguments as in :func:`attention`."""
    bias_HTS = None if alibi_slopes is None else alibi_bias_from_slopes(alibi_slopes, q_len, k_len, offset=q_offset)
    if relative_bias is not None:
        relative_HTS = relative_position_bias(relative_bias, q_len, k_len, offset=q_offset,
                                              bidirectional=relative_bidirectional, max_distance=relative_max_distance)
        bias_HTS = relative_HTS if bias_HTS is None else bias_HTS + relative_HTS
    return bias_HTS


def _causal_query_blocks(q, k, v, *, query_block_size: int, **kwargs) -> jax.Array:
    """Causal self-attention, block by block of queries: block ``[t0, t1)`` sees keys ``[0, t1)``."""
    T = q.shape[-3]
    outs = []
    for t0 in range(0, T, query_block_size):
        t1 = min(t0 + query_block_size, T)
        outs.append(attention(q[..., t0:t1, :, :], k[..., :t1, :, :], v[..., :t1, :, :], causal=True, q_offset=t0,
                              **kwargs))
    return jnp.concatenate(outs, axis=-3)
