"""Scaled dot-product attention, the one implementation every other path is tested against.

Shapes follow ``jax.nn.dot_product_attention``: per-head tensors are
``[batch, seq, heads, head_dim]`` (the batch axis may be omitted). Shape letters in names
(``q_BTHD``, ``k_BSKD``, ``q_BTKGD``) follow the legend of :mod:`jaxformer.functional`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def _check_rank(name: str, x: jax.Array, rank: int) -> None:
    if x.ndim != rank:
        raise ValueError(f"{name} must have rank {rank} like q ([batch, seq, heads, head_dim]), got shape {x.shape}")


def group_heads(q_BTHD: jax.Array, num_kv_heads: int) -> jax.Array:
    """Split H query heads into K groups of G = H // K: ``[B, T, H, D] -> [B, T, K, G, D]``.

    Query head ``h`` shares key/value head ``h // G`` (the layout of GQA checkpoints
    and of ``jax.nn.dot_product_attention``).
    """
    num_heads = q_BTHD.shape[-2]
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"query heads ({num_heads}) must be a multiple of key/value heads ({num_kv_heads})"
        )
    B, T, H, D = q_BTHD.shape
    return q_BTHD.reshape(B, T, num_kv_heads, H // num_kv_heads, D)


def validate_qkv(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, bool]:
    """Checks ranks and shapes; returns batched ``(q, k, v, was_unbatched)``.

    ``q [B, T, H, D]``, ``k [B, S, K, D]`` and ``v [B, S, K, ·]`` (its head dimension may differ from D), or all
    three without ``B``; ``H`` a multiple of ``K``.
    """
    if q.ndim not in (3, 4):
        raise ValueError(f"q must have shape [batch, seq, heads, head_dim] or [seq, heads, head_dim], got {q.shape}")
    _check_rank("k", k, q.ndim)
    _check_rank("v", v, q.ndim)
    unbatched = q.ndim == 3
    if unbatched:
        q, k, v = q[None], k[None], v[None]
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must agree on batch, seq and heads, got k {k.shape} and v {v.shape}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k batch sizes differ: {q.shape[0]} vs {k.shape[0]}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head_dim differ: {q.shape[-1]} vs {k.shape[-1]}")
    group_heads(q, k.shape[2])  # raises when the head counts do not divide
    return q, k, v, unbatched


def attention_logits(q_BTHD: jax.Array, k_BSKD: jax.Array, *, bias: jax.Array | None = None,
                     scale: float | None = None) -> jax.Array:
    """Scores ``q·kᵀ·scale + bias`` as ``[B, H, T, S]``, in at least float32; ``bias`` broadcasts to that shape,
    ``scale`` defaults to ``1/sqrt(D)``."""
    B, T, H, D = q_BTHD.shape
    K = k_BSKD.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q_BTKGD = group_heads(q_BTHD, K)
    logits_BKGTS = jnp.einsum("btkgd,bskd->bkgts", q_BTKGD, k_BSKD, preferred_element_type=jnp.promote_types(q_BTHD.dtype, jnp.float32))
    logits_BHTS = logits_BKGTS.reshape(B, H, T, k_BSKD.shape[1]) * scale
    if bias is not None:
        logits_BHTS = logits_BHTS + bias
    return logits_BHTS


def masked_softmax(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Softmax over the last axis with ``mask`` (True = keep) applied before it.

    ``logits [..., S]`` (attention's ``[B, H, T, S]``), ``mask`` boolean and broadcastable to them; returns
    weights of their shape and dtype, each row summing to 1 over its kept keys. The row maximum is subtracted;
    a row with nothing to attend to gives zeros, not NaN.
    """
    if mask is not None:
        logits = jnp.where(mask, logits, -jnp.inf)
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    row_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
    unnormalised = jnp.exp(logits - row_max)
    total = jnp.sum(unnormalised, axis=-1, keepdims=True)
    return unnormalised / jnp.where(total == 0.0, 1.0, total)


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    scale: float | None = None,
    return_weights: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """``softmax(q·kᵀ·scale + bias) · v`` over keys, materialising the scores.

    Args:
      q: ``[B, T, H, D]`` queries (or ``[T, H, D]``).
      k, v: ``[B, S, K, D]`` keys and values; ``H`` must be a multiple of ``K``
        (K = H: multi-head, 1 < K < H: grouped-query, K = 1: multi-query). T ≠ S is
        cross-attention.
      mask: boolean, True where a query may attend, broadcastable to ``[B, H, T, S]``.
      bias: added to the scaled scores (e.g. ALiBi), broadcastable to ``[B, H, T, S]``.
      scale: multiplies the scores; defaults to ``1/sqrt(D)``.
      return_weights: also return the ``[B, H, T, S]`` attention weights.

    Returns:
      ``[B, T, H, D]`` outputs in q's dtype, or ``(outputs, weights)``.
    """
    q, k, v, unbatched = validate_qkv(q, k, v)
    weights_BHTS = masked_softmax(attention_logits(q, k, bias=bias, scale=scale), mask)
    B, H, T, S = weights_BHTS.shape
    K = k.shape[2]
    weights_BKGTS = weights_BHTS.reshape(B, K, H // K, T, S)
    out_BTKGD = jnp.einsum("bkgts,bskd->btkgd", weights_BKGTS.astype(v.dtype), v)
    out_BTHD = out_BTKGD.reshape(B, T, H, v.shape[-1]).astype(q.dtype)
    if unbatched:
        out_BTHD, weights_BHTS = out_BTHD[0], weights_BHTS[0]
    return (out_BTHD, weights_BHTS) if return_weights else out_BTHD
