"""Pooling a sequence of hidden states into one vector per sequence (sentence embeddings)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mean_pool(x_BTE: jax.Array, lengths_B: jax.Array | None = None) -> jax.Array:
    """``[B, T, E] -> [B, E]``: the mean over each sequence's first ``lengths_B[b]`` positions (right padding).

    ``lengths_B`` None averages all ``T`` positions. This is sentence-transformers' mean pooling
    (its attention-mask-weighted mean); a length of 0 gives zeros.
    """
    x32_BTE = x_BTE.astype(jnp.promote_types(x_BTE.dtype, jnp.float32))
    if lengths_B is None:
        return jnp.mean(x32_BTE, axis=1).astype(x_BTE.dtype)
    valid_BT1 = (jnp.arange(x_BTE.shape[1])[None, :] < jnp.asarray(lengths_B)[:, None])[..., None]
    total_BE = jnp.sum(jnp.where(valid_BT1, x32_BTE, 0.0), axis=1)
    count_B1 = jnp.maximum(jnp.sum(valid_BT1, axis=1), 1).astype(total_BE.dtype)
    return (total_BE / count_B1).astype(x_BTE.dtype)


def l2_normalize(x_BE: jax.Array, *, eps: float = 1e-12) -> jax.Array:
    """``[B, E] -> [B, E]`` (any leading axes): each row divided by its Euclidean norm (at least ``eps``), as
    ``torch.nn.functional.normalize``; x's dtype, the norm taken in at least float32."""
    norm_B1 = jnp.linalg.norm(x_BE.astype(jnp.promote_types(x_BE.dtype, jnp.float32)), axis=-1, keepdims=True)
    return (x_BE / jnp.maximum(norm_B1, eps)).astype(x_BE.dtype)
