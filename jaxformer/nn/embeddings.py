"""Token embeddings and absolute positions (learned table or sinusoids).

RoPE and ALiBi are relative: they act inside attention (`jaxformer.nn.attention`),
so for them, and for ``position: none``, the embedding adds nothing here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import jaxformer.functional as F
from jaxformer.architecture import ModelConfig, check_context
from jaxformer.nn import params


class Embedding(nnx.Module):
    """``tokens [B, T] -> [B, T, E]``: token vectors plus absolute positions; also the tied output head.

    Parameters: ``tokens [V, E]`` and, for ``position: learned``, ``positions [max_seq_len, E]``.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tokens = params.normal(rngs, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"))
        learned = cfg.position == "learned"
        self.positions = params.normal(rngs, (cfg.max_seq_len, cfg.d_model), ("position", "embed")) if learned else None

    def __call__(self, tokens_BT: jax.Array, *, offset: int | jax.Array = 0) -> jax.Array:
        """Token ``t`` of the sequence sits at position ``offset + t`` (``offset`` = cache length when decoding).

        A static length past the table raises; a traced offset that runs past it (a
        caller that skipped the cache's length check) gives NaN rows, never a wrap-around.
        """
        T = tokens_BT.shape[1]
        if isinstance(offset, int):
            check_context(self.cfg, offset + T)
        x_BTE = self.tokens[...][tokens_BT]
        positions_T = offset + jnp.arange(T)
        if self.cfg.position == "learned":
            x_BTE = x_BTE + self.positions[...].at[positions_T].get(mode="fill", fill_value=jnp.nan)
        elif self.cfg.position == "sinusoidal":
            table_PE = F.sinusoidal_positions(self.cfg.max_seq_len, self.cfg.d_model).astype(x_BTE.dtype)
            x_BTE = x_BTE + table_PE.at[positions_T].get(mode="fill", fill_value=jnp.nan)
        return x_BTE

    def attend(self, x_BTE: jax.Array) -> jax.Array:
        """Tied output head: ``x · tokensᵀ``, ``[B, T, E] -> [B, T, V]`` float32 logits."""
        return F.dense(x_BTE, self.tokens[...].T, preferred_element_type=jnp.float32)
