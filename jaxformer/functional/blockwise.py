"""Exact blockwise attention: FlashAttention's algorithm (Dao et al. 2022; Dao 2023) in plain JAX.

Keys and values are cut into tiles of ``block_size``; a ``lax.scan`` walks them with a
running row maximum and normaliser (the online softmax), so the largest score array ever
held is ``[B, H, T, L]`` (``L = block_size``), never ``[B, H, T, S]``. The backward pass is a
``jax.custom_vjp`` that saves only the output and the row log-sum-exp and recomputes each
tile's scores, as FlashAttention does; autodiff through the scan would instead keep every
tile's probabilities, i.e. the whole ``T × S`` matrix.

Masks, ALiBi and T5 relative biases come from structured arguments and are built per tile with
the same functions the plain path uses (:func:`~jaxformer.functional.masks.attention_mask`,
:func:`~jaxformer.functional.positions.alibi_bias_from_slopes`,
:func:`~jaxformer.functional.positions.relative_position_bias`), shifted by the tile's
first key position. Shape letters as in the legend of :mod:`jaxformer.functional`; here
``L`` is the keys per tile (``block_size``) and ``M`` the number of tiles.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.checks import require_positive
from jaxformer.functional.dot_product import group_heads, validate_qkv
from jaxformer.functional.masks import attention_mask
from jaxformer.functional.positions import alibi_bias_from_slopes, relative_position_bias


class _Static(NamedTuple):
    """Trace-time settings (hashable, so they can be a ``nondiff_argnum``)."""

    causal: bool
    window: int | None
    scale: float
    relative_bidirectional: bool = True
    relative_max_distance: int = 128


def check_structured_args(q_BTHD: jax.Array, key_lengths: jax.Array | None, window: int | None,
                          alibi_slopes: jax.Array | None, relative_bias: jax.Array | None = None) -> None:
    """Shape checks shared by every attention path; raises one-line ``ValueError``s.

    ``q_BTHD [B, T, H, D]`` (batched); ``key_lengths [B]``, ``alibi_slopes [H]``, ``relative_bias [P, H]``;
    ``window`` a positive number of keys.
    """
    B, _, H, _ = q_BTHD.shape
    if key_lengths is not None and jnp.shape(key_lengths) != (B,):
        raise ValueError(f"key_lengths must have shape [batch] = ({B},), got {jnp.shape(key_lengths)}")
    if window is not None:
        require_positive("window", window)
    if alibi_slopes is not None and jnp.shape(alibi_slopes) != (H,):
        raise ValueError(f"alibi_slopes must have shape [heads] = ({H},), got {jnp.shape(alibi_slopes)}")
    if relative_bias is not None and (jnp.ndim(relative_bias) != 2 or jnp.shape(relative_bias)[1] != H):
        raise ValueError(f"relative_bias must have shape [buckets, heads] = (P, {H}), got {jnp.shape(relative_bias)}")


def _tile_logits(static: _Static, q_BTKGD, k_BLKD, slopes_H, table_PH, j0, q_offset, lengths_B) -> jax.Array:
    """``[B, K, G, T, L]`` scaled, biased scores of every query against keys ``j0 .. j0+L-1``; -inf where masked."""
    B, T, K, G, _ = q_BTKGD.shape
    L = k_BLKD.shape[1]
    compute_dtype = jnp.promote_types(q_BTKGD.dtype, jnp.float32)
    logits_BKGTL = jnp.einsum("btkgd,blkd->bkgtl", q_BTKGD, k_BLKD, preferred_element_type=compute_dtype)
    logits_BKGTL = logits_BKGTL * static.scale
    offset = q_offset - j0  # query i sits at i + q_offset; tile key l at j0 + l
    if slopes_H is not None:
        bias_HTL = alibi_bias_from_slopes(slopes_H, T, L, offset=offset)
        logits_BKGTL = logits_BKGTL + bias_HTL.reshape(K, G, T, L).astype(compute_dtype)
    if table_PH is not None:
        bias_HTL = relative_position_bias(table_PH, T, L, offset=offset, bidirectional=static.relative_bidirectional,
                                          max_distance=static.relative_max_distance)
        logits_BKGTL = logits_BKGTL + bias_HTL.reshape(K, G, T, L).astype(compute_dtype)
    tile_lengths_B = None if lengths_B is None else lengths_B - j0
    mask_B11TL = attention_mask(T, L, causal=static.causal, window=static.window, key_lengths=tile_lengths_B, offset=offset)
    if mask_B11TL is not None:
        logits_BKGTL = jnp.where(mask_B11TL[:, :, None], logits_BKGTL, -jnp.inf)
    return logits_BKGTL


def _tile_starts(k_MBLKD: jax.Array) -> jax.Array:
    """``[M]`` absolute position of each tile's first key."""
    M, _, L = k_MBLKD.shape[:3]
    return jnp.arange(M) * L


def _forward(static, q_BTKGD, k_MBLKD, v_MBLKD, slopes_H, table_PH, q_offset, lengths_B):
    """Online softmax over key tiles: returns ``out [B, T, K, G, D]`` and ``logsumexp [B, K, G, T]``."""
    B, T, K, G, _ = q_BTKGD.shape
    D_v = v_MBLKD.shape[-1]
    compute_dtype = jnp.promote_types(q_BTKGD.dtype, jnp.float32)

    def step(carry, tile):
        acc_BKGTD, max_BKGT, total_BKGT = carry
        k_BLKD, v_BLKD, j0 = tile
        logits_BKGTL = _tile_logits(static, q_BTKGD, k_BLKD, slopes_H, table_PH, j0, q_offset, lengths_B)
        new_max_BKGT = jnp.maximum(max_BKGT, jnp.max(logits_BKGTL, axis=-1))
        # a row that has seen no visible key yet keeps max -inf; shift by 0 so exp gives 0, not NaN
        shift_BKGT = jnp.where(jnp.isfinite(new_max_BKGT), new_max_BKGT, 0.0)
        probs_BKGTL = jnp.exp(logits_BKGTL - shift_BKGT[..., None])
        rescale_BKGT = jnp.exp(max_BKGT - shift_BKGT)
        total_BKGT = total_BKGT * rescale_BKGT + jnp.sum(probs_BKGTL, axis=-1)
        tile_out_BKGTD = jnp.einsum(
            "bkgtl,blkd->bkgtd", probs_BKGTL.astype(v_BLKD.dtype), v_BLKD, preferred_element_type=compute_dtype
        )
        acc_BKGTD = acc_BKGTD * rescale_BKGT[..., None] + tile_out_BKGTD
        return (acc_BKGTD, new_max_BKGT, total_BKGT), None

    init = (
        jnp.zeros((B, K, G, T, D_v), compute_dtype),
        jnp.full((B, K, G, T), -jnp.inf, compute_dtype),
        jnp.zeros((B, K, G, T), compute_dtype),
    )
    (acc_BKGTD, max_BKGT, total_BKGT), _ = jax.lax.scan(step, init, (k_MBLKD, v_MBLKD, _tile_starts(k_MBLKD)))
    seen_BKGT = total_BKGT > 0  # False: every key masked; the plain path returns zeros there too
    out_BKGTD = acc_BKGTD / jnp.where(seen_BKGT, total_BKGT, 1.0)[..., None]
    # 0 for empty rows: their scores are all -inf, so the backward's exp(score - lse) is 0 anyway
    logsumexp_BKGT = jnp.where(seen_BKGT, max_BKGT + jnp.log(jnp.where(seen_BKGT, total_BKGT, 1.0)), 0.0)
    return jnp.moveaxis(out_BKGTD, 3, 1).astype(q_BTKGD.dtype), logsumexp_BKGT


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blockwise(static, q_BTKGD, k_MBLKD, v_MBLKD, slopes_H, table_PH, q_offset, lengths_B):
    return _forward(static, q_BTKGD, k_MBLKD, v_MBLKD, slopes_H, table_PH, q_offset, lengths_B)[0]


def _blockwise_fwd(static, q_BTKGD, k_MBLKD, v_MBLKD, slopes_H, table_PH, q_offset, lengths_B):
    out_BTKGD, logsumexp_BKGT = _forward(static, q_BTKGD, k_MBLKD, v_MBLKD, slopes_H, table_PH, q_offset, lengths_B)
    return out_BTKGD, (q_BTKGD, k_MBLKD, v_MBLKD, slopes_H, table_PH, q_offset, lengths_B, out_BTKGD, logsumexp_BKGT)


def _blockwise_bwd(static, residuals, d_out_BTKGD):
    """FlashAttention-2's backward: per tile, recompute ``P = exp(S - lse)`` and accumulate dQ; emit dK, dV."""
    q_BTKGD, k_MBLKD, v_MBLKD, slopes_H, table_PH, q_offset, lengths_B, out_BTKGD, logsumexp_BKGT = residuals
    compute_dtype = jnp.promote_types(q_BTKGD.dtype, jnp.float32)
    d_out_BKGTD = jnp.moveaxis(d_out_BTKGD, 1, 3).astype(compute_dtype)
    # Δ_i = Σ_d dO_id·O_id = Σ_j P_ij·dP_ij, the softmax Jacobian's correction term
    delta_BKGT = jnp.sum(d_out_BKGTD * jnp.moveaxis(out_BTKGD, 1, 3).astype(compute_dtype), axis=-1)

    def step(carry, tile):
        d_q_BTKGD, d_slopes_H, d_table_PH = carry
        k_BLKD, v_BLKD, j0 = tile
        logits_BKGTL, logits_vjp = jax.vjp(
            lambda q, k, slopes, table: _tile_logits(static, q, k, slopes, table, j0, q_offset, lengths_B),
            q_BTKGD, k_BLKD, slopes_H, table_PH,
        )
        probs_BKGTL = jnp.exp(logits_BKGTL - logsumexp_BKGT[..., None])
        d_v_BLKD = jnp.einsum("bkgtl,bkgtd->blkd", probs_BKGTL, d_out_BKGTD)
        d_probs_BKGTL = jnp.einsum("bkgtd,blkd->bkgtl", d_out_BKGTD, v_BLKD.astype(compute_dtype))
        d_logits_BKGTL = probs_BKGTL * (d_probs_BKGTL - delta_BKGT[..., None])
        d_q_tile, d_k_BLKD, d_slopes_tile, d_table_tile = logits_vjp(d_logits_BKGTL)
        if d_slopes_H is not None:
            d_slopes_H = d_slopes_H + d_slopes_tile
        if d_table_PH is not None:
            d_table_PH = d_table_PH + d_table_tile
        carry = (d_q_BTKGD + d_q_tile.astype(compute_dtype), d_slopes_H, d_table_PH)
        return carry, (d_k_BLKD, d_v_BLKD.astype(v_BLKD.dtype))

    init = (jnp.zeros(q_BTKGD.shape, compute_dtype), None if slopes_H is None else jnp.zeros_like(slopes_H),
            None if table_PH is None else jnp.zeros_like(table_PH))
    (d_q_BTKGD, d_slopes_H, d_table_PH), (d_k_MBLKD, d_v_MBLKD) = jax.lax.scan(
        step, init, (k_MBLKD, v_MBLKD, _tile_starts(k_MBLKD))
    )
    # integer inputs (offset, lengths) have no cotangent
    return d_q_BTKGD.astype(q_BTKGD.dtype), d_k_MBLKD, d_v_MBLKD, d_slopes_H, d_table_PH, None, None


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def blockwise_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
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
) -> jax.Array:
    """Exact ``softmax(q·kᵀ·scale + bias)·v`` in key tiles, with O(T·block_size) scratch memory.

    Args:
      q: ``[B, T, H, D]`` queries (or ``[T, H, D]``); query ``i`` sits at position ``i + q_offset``.
      k, v: ``[B, S, K, D]`` keys and values at positions ``0 .. S-1``; ``H`` a multiple of ``K``.
      causal: keep keys ``j <= i + q_offset``.
      q_offset: position of the first query (a KV-cache length when decoding); may be traced.
      key_lengths: ``[B]`` int; keys ``j >= key_lengths[b]`` are padding.
      window: causal sliding window, keys ``0 <= (i + q_offset) - j < window`` (implies causal).
      alibi_slopes: ``[H]``; adds ``-slope_h·|i + q_offset - j|`` after scaling (differentiable).
      relative_bias: ``[P, H]`` T5 bias table, ``relative_bias[bucket(i + q_offset - j), h]`` added after
        scaling (differentiable; buckets ``relative_bidirectional`` up to ``relative_max_distance``).
      scale: multiplies the scores; defaults to ``1/sqrt(D)``.
      block_size: keys per tile; S need not be a multiple (the last tile is padded and masked).

    Returns ``[B, T, H, D]`` in q's dtype; rows with no visible key are zeros, as in the plain path.
    """
    q, k, v, unbatched = validate_qkv(q, k, v)
    check_structured_args(q, key_lengths, window, alibi_slopes, relative_bias)
    require_positive("block_size", block_size)
    B, T, H, D = q.shape
    S, K = k.shape[1], k.shape[2]
    L = min(int(block_size), S)
    M = -(-S // L)
    static = _Static(causal=bool(causal), window=None if window is None else int(window),
                     scale=1.0 / math.sqrt(D) if scale is None else float(scale),
                     relative_bidirectional=bool(relative_bidirectional),
                     relative_max_distance=int(relative_max_distance))
    lengths_B = None if key_lengths is None else jnp.minimum(jnp.asarray(key_lengths, jnp.int32), S)
    if M * L != S and lengths_B is None:
        lengths_B = jnp.full((B,), S, jnp.int32)  # hides the padding keys of the last tile

    def tiles(x_BSKD: jax.Array) -> jax.Array:
        """``[B, S, K, D] -> [M, B, L, K, D]``, zero-padded to M·L keys."""
        x_BSKD = jnp.pad(x_BSKD, ((0, 0), (0, M * L - S), (0, 0), (0, 0)))
        return jnp.moveaxis(x_BSKD.reshape(B, M, L, K, x_BSKD.shape[-1]), 1, 0)

    out_BTKGD = _blockwise(
        static,
        group_heads(q, K),
        tiles(k),
        tiles(v),
        None if alibi_slopes is None else jnp.asarray(alibi_slopes),
        None if relative_bias is None else jnp.asarray(relative_bias),
        jnp.asarray(q_offset, jnp.int32),
        lengths_B,
    )
    out_BTHD = out_BTKGD.reshape(B, T, H, v.shape[-1])
    return out_BTHD[0] if unbatched else out_BTHD
