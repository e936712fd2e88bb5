"""Writing a layer's new keys/values into its KV cache, and the view of the cache that queries attend to.

Two layouts, both fixed-size (so a jitted decode step never recompiles):

- **linear** (no sliding window, or a window no shorter than the cache): slot ``j`` holds
  position ``j``; ``max_len`` slots.
- **ring** (sliding window ``W`` with ``max_len >= W``): ``W`` slots, position ``p`` in slot
  ``p mod W``, so the cache never holds more than the window — the size
  ``jaxformer.accounting.kv_cache_bytes`` counts. A ring takes a prefill into an empty
  cache (any length) or one token at a time; a multi-token extension of a non-empty
  ring is not supported and gives NaN outputs rather than wrong ones.

Positions are absolute token positions; ``offset`` is the cache length before the write.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

KV = tuple[jax.Array, jax.Array]  # one layer's cache: (k [B, slots, K, D], v [B, slots, K, D])


class CacheView(NamedTuple):
    """The updated cache and what the new queries attend to.

    ``k``/``v`` ``[B, S, K, D]`` are ordered by position, the first at position
    ``offset - q_offset`` (so the structured-mask arguments keep their meaning);
    ``key_lengths [B]`` hides unfilled slots; ``supported`` (None: always) is False for
    a multi-token extension of a non-empty ring.
    """

    cache: KV
    k: jax.Array
    v: jax.Array
    q_offset: jax.Array
    key_lengths: jax.Array | None
    supported: jax.Array | None


def cache_slots(max_len: int, window: int | None) -> int:
    """Slots a layer's cache needs for ``max_len`` positions."""
    return max_len if window is None else min(max_len, window)


def _write(cache: jax.Array, new_BTKD: jax.Array, start) -> jax.Array:
    return jax.lax.dynamic_update_slice(cache, new_BTKD.astype(cache.dtype), (0, start, 0, 0))


def update(kv_cache: KV, k_BTKD: jax.Array, v_BTKD: jax.Array, offset: int | jax.Array, *,
           window: int | None) -> CacheView:
    """Writes ``T`` new keys/values at positions ``offset … offset+T-1`` and returns the view to attend to.

    ``kv_cache``: ``(k, v)``, each ``[B, slots, K, D]`` (`cache_slots`); ``k_BTKD``, ``v_BTKD [B, T, K, D]``;
    ``offset``: the position of the first new key (an int, or a traced int32 scalar).
    """
    (k_cache, v_cache), (B, T) = kv_cache, k_BTKD.shape[:2]
    slots = k_cache.shape[1]
    if window is None or slots < window:  # linear: the window (if any) never wraps this cache
        k_all, v_all = _write(k_cache, k_BTKD, offset), _write(v_cache, v_BTKD, offset)
        return CacheView((k_all, v_all), k_all, v_all, offset, jnp.full((B,), offset + T), None)
    if T == 1:
        slot = offset % slots
        k_ring, v_ring = _write(k_cache, k_BTKD, slot), _write(v_cache, v_BTKD, slot)
        # once wrapped, rotate so the oldest position comes first and the new one last
        wrapped = offset >= slots
        shift = jnp.where(wrapped, (offset + 1) % slots, 0)
        k_view, v_view = jnp.roll(k_ring, -shift, axis=1), jnp.roll(v_ring, -shift, axis=1)
        lengths = jnp.full((B,), jnp.minimum(offset + 1, slots))
        return CacheView((k_ring, v_ring), k_view, v_view, jnp.minimum(offset, slots - 1), lengths, None)
    # prefill into an empty ring: attend to the new keys themselves, keep the last `slots` of them
    if T <= slots:
        k_ring, v_ring = _write(k_cache, k_BTKD, 0), _write(v_cache, v_BTKD, 0)
    else:  # position p goes to slot p mod slots
        shift = (T - slots) % slots
        k_ring = jnp.roll(k_BTKD[:, T - slots:], shift, axis=1).astype(k_cache.dtype)
        v_ring = jnp.roll(v_BTKD[:, T - slots:], shift, axis=1).astype(v_cache.dtype)
    return CacheView((k_ring, v_ring), k_BTKD, v_BTKD, offset, None, offset == 0)
