"""`KVCache`: the keys and values of every self-attention layer, for decoding one token at a time.

A fixed-size buffer per layer (``[B, slots, K, D]`` for K and for V) and the number
of filled positions. Its shapes never change while decoding, so the jitted step
compiles once; writing at ``length`` is an in-place ``dynamic_update_slice`` when the
cache is donated. ``slots`` is ``max_len``, or ``min(max_len, sliding_window)`` for a
windowed model (a ring buffer, see `jaxformer.nn.kv`), so the size is
``2 · layers · K · D · slots · bytes · B`` — exactly
``jaxformer.accounting.kv_cache_bytes(cfg, max_len, batch=B, bytes_per_value=…)`` for a decoder (for an
encoder–decoder that count adds the cross-attention keys and values of the source, held beside this cache).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxformer.architecture import ModelConfig, check_context
from jaxformer.nn.kv import cache_slots


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """``keys``/``values``: one ``[B, slots, K, D]`` array per layer; ``length``: int32 scalar, positions written."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    length: jax.Array

    @classmethod
    def create(cls, cfg: ModelConfig, batch: int, max_len: int, dtype=jnp.float32) -> "KVCache":
        """An empty cache for ``batch`` sequences of up to ``max_len`` (≤ ``cfg.max_seq_len``) tokens."""
        check_context(cfg, max_len, what="cache length")
        if batch <= 0 or max_len <= 0:
            raise ValueError(f"cache batch and max_len must be positive, got {batch} and {max_len}")
        shape = (batch, cache_slots(max_len, cfg.sliding_window), cfg.num_kv_heads, cfg.head_dim)
        empty = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
        return cls(keys=empty, values=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
                   length=jnp.zeros((), jnp.int32))

    @property
    def slots(self) -> int:
        """Positions held per layer: ``max_len``, or the sliding window when that is shorter."""
        return self.keys[0].shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys and values (the length counter excluded)."""
        return sum(int(x.nbytes) for x in self.keys + self.values)

    def layers(self) -> tuple[tuple[jax.Array, jax.Array], ...]:
        """``((k, v), …)`` per layer, the form `jaxformer.nn.Stack` takes."""
        return tuple(zip(self.keys, self.values))

    def advanced(self, layers: tuple[tuple[jax.Array, jax.Array], ...], new_tokens: int) -> "KVCache":
        """The cache after ``layers`` were written and ``new_tokens`` more positions filled."""
        return KVCache(keys=tuple(k for k, _ in layers), values=tuple(v for _, v in layers),
                       length=self.length + new_tokens)
