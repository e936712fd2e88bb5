"""Boolean attention masks: True where a query may attend to a key.

Query ``i`` sits at absolute position ``i + offset``, so a decode step against a cache
of ``offset`` earlier tokens uses ``offset=cache_length``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxformer.checks import require_positive


def query_key_distance(q_len: int, k_len: int, offset: int | jax.Array) -> jax.Array:
    """``[T, S]`` integer ``(i + offset) - j``: how many positions query ``i`` (at ``i + offset``) is past key ``j``.

    The one computation of the distance: masks, ALiBi, T5's relative bias and the fused kernel's plain reference
    read it; ``offset`` may be traced.
    """
    query_pos = jnp.arange(q_len)[:, None] + offset
    return query_pos - jnp.arange(k_len)[None, :]


def causal_mask(q_len: int, k_len: int | None = None, *, offset: int = 0) -> jax.Array:
    """``[q_len, k_len]``: query ``i`` sees keys ``j <= i + offset``."""
    k_len = q_len if k_len is None else k_len
    require_positive("q_len", q_len)
    require_positive("k_len", k_len)
    return query_key_distance(q_len, k_len, offset) >= 0


def sliding_window_mask(q_len: int, k_len: int, window: int, *, offset: int = 0) -> jax.Array:
    """``[q_len, k_len]``: causal, and only the last ``window`` keys (itself included)."""
    require_positive("window", window)
    distance = query_key_distance(q_len, k_len, offset)
    return (distance >= 0) & (distance < window)


def padding_mask(lengths: jax.Array, max_len: int) -> jax.Array:
    """``[B, 1, 1, max_len]`` key mask: key ``j`` of sequence ``b`` is real when ``j < lengths[b]``.

    Broadcasts against ``[B, H, T, S]`` attention scores.
    """
    require_positive("max_len", max_len)
    lengths = jnp.asarray(lengths)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be a 1-D array of sequence lengths, got shape {lengths.shape}")
    return (jnp.arange(max_len)[None, :] < lengths[:, None])[:, None, None, :]


def attention_mask(
    q_len: int,
    k_len: int,
    *,
    causal: bool = False,
    window: int | None = None,
    key_lengths: jax.Array | None = None,
    offset: int | jax.Array = 0,
) -> jax.Array | None:
    """``[B or 1, 1, q_len, k_len]`` mask from structured arguments, or None when all keys are visible.

    Causal keeps ``j <= i + offset``; ``window`` is the causal sliding window
    (:func:`sliding_window_mask`); ``key_lengths [B]`` hides keys ``j >= key_lengths[b]``.
    A tile of keys starting at ``j0`` is ``attention_mask(..., key_lengths=key_lengths - j0,
    offset=offset - j0)``, which is how the blockwise path builds its masks.
    """
    mask = None
    if window is not None:
        mask = sliding_window_mask(q_len, k_len, window, offset=offset)[None, None]
    elif causal:
        mask = causal_mask(q_len, k_len, offset=offset)[None, None]
    if key_lengths is not None:
        keys = padding_mask(key_lengths, k_len)
        mask = keys if mask is None else mask & keys
    return mask
