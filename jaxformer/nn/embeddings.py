"""Token embeddings and absolute positions (learned table or sinusoids), token types, the embedding norm.

RoPE and ALiBi are relative: they act inside attention (`jaxformer.nn.attention`),
so for them, and for ``position: none``, the embedding adds nothing here.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxformer.functional as F
from jaxformer.architecture import ModelConfig, check_context
from jaxformer.nn import params
from jaxformer.nn.norms import Norm


class Embedding(nnx.Module):
    """``tokens [B, T] -> [B, T, E]``: token vectors plus absolute positions; also the tied output head.

    Parameters: ``tokens [V, E]``; for ``position: learned``, ``positions [max_seq_len, E]``;
    with ``cfg.num_token_types``, ``token_types [num_token_types, E]``; with
    ``cfg.embedding_norm``, a `Norm` (``norm``) applied to the sum.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tokens = params.normal(rngs, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"))
        learned = cfg.position == "learned"
        self.positions = params.normal(rngs, (cfg.max_seq_len, cfg.d_model), ("position", "embed")) if learned else None
        types = cfg.num_token_types
        self.token_types = params.normal(rngs, (types, cfg.d_model), (None, "embed")) if types else None
        self.norm = Norm(cfg) if cfg.embedding_norm else None

    def __call__(self, tokens_BT: jax.Array, *, offset: int | np.integer | jax.Array = 0,
                 token_types_BT: jax.Array | None = None) -> jax.Array:
        """Token ``t`` of the sequence sits at position ``offset + t`` (``offset`` = cache length when decoding).

        ``x = tokens·(√E if cfg.scale_embeddings) + positions + token_types``, then the
        embedding norm if any. ``token_types_BT`` (ids below ``cfg.num_token_types``; None: all 0)
        needs a model with token types.

        A static length (``offset`` a Python or NumPy integer) past the table raises; a traced
        offset that runs past it (a caller that skipped the cache's length check) gives NaN rows,
        never a wrap-around.
        """
        cfg = self.cfg
        T = tokens_BT.shape[1]
        if isinstance(offset, numbers.Integral):  # a Python or NumPy integer: static
            check_context(cfg, offset + T)
        x_BTE = self.tokens[...][tokens_BT]
        if cfg.scale_embeddings:
            x_BTE = x_BTE * jnp.asarray(cfg.d_model ** 0.5, x_BTE.dtype)
        positions_T = offset + jnp.arange(T)
        if cfg.position == "learned":
            x_BTE = x_BTE + self.positions[...].at[positions_T].get(mode="fill", fill_value=jnp.nan)
        elif cfg.position == "sinusoidal":
            table_PE = F.sinusoidal_positions(cfg.max_seq_len, cfg.d_model,
                                              split=cfg.sinusoidal_layout == "split").astype(x_BTE.dtype)
            x_BTE = x_BTE + table_PE.at[positions_T].get(mode="fill", fill_value=jnp.nan)
        if self.token_types is not None:
            types_BT = jnp.zeros_like(tokens_BT) if token_types_BT is None else token_types_BT
            x_BTE = x_BTE + self.token_types[...][types_BT]
        elif token_types_BT is not None:
            raise ValueError("token_types_BT given, but the model has no token types (model.num_token_types=0)")
        return x_BTE if self.norm is None else self.norm(x_BTE)

    def attend(self, x_BTE: jax.Array, *, matmul_impl: str = "xla") -> jax.Array:
        """Tied output head: ``x · tokensᵀ``, ``[B, T, E] -> [B, T, V]`` float32 logits (`F.dense`'s ``impl``)."""
        return F.dense(x_BTE, self.tokens[...].T, preferred_element_type=jnp.float32, impl=matmul_impl)
