"""Per-token normalisations over the last (feature) axis."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def layer_norm(x: jax.Array, scale: jax.Array | None = None, bias: jax.Array | None = None, *, eps: float = 1e-5) -> jax.Array:
    """``(x - mean) / sqrt(var + eps) · scale + bias`` over the last axis (Ba et al. 2016).

    ``x [..., E]``, ``scale`` and ``bias [E]``; returns x's shape and dtype, computed in at least float32.
    """
    x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(variance + eps)
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype)


def rms_norm(x: jax.Array, scale: jax.Array | None = None, *, eps: float = 1e-6) -> jax.Array:
    """``x / sqrt(mean(x²) + eps) · scale`` over the last axis (Zhang and Sennrich 2019).

    ``x [..., E]``, ``scale [E]``; returns x's shape and dtype, computed in at least float32.
    """
    x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    if scale is not None:
        y = y * scale
    return y.astype(x.dtype)
