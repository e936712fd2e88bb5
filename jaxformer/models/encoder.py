"""`EncoderMLM`: the bidirectional encoder (BERT), with its masked-LM head and pooler when configured.

Sentence embeddings (`embed`): the encoder's final hidden states pooled per sequence —
the mean over the real tokens (sentence-transformers), the first token's state, or BERT's
pooler (tanh of a dense layer on the first token).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

import jaxformer.functional as F
from jaxformer.architecture import ModelConfig
from jaxformer.functional.feedforward import ACTIVATIONS
from jaxformer.kernel import KernelConfig
from jaxformer.models.decoder import OutputHead
from jaxformer.nn import params
from jaxformer.nn.block import Stack
from jaxformer.nn.embeddings import Embedding
from jaxformer.nn.norms import Norm

Pooling = Literal["mean", "first", "pooler"]


class MLMHead(nnx.Module):
    """BERT's prediction head: dense ``[E, E]`` (+ bias), activation, norm, vocabulary projection (+ ``bias [V]``).

    The activation is the model's (``cfg.activation``; exact GELU for a gated model's head,
    which has one branch). Both products compute with ``kernel.matmul_impl``.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, kernel: KernelConfig = KernelConfig()):
        self.matmul_impl = kernel.matmul_impl
        self.activation = "gelu" if cfg.is_gated else cfg.activation
        self.transform = params.normal(rngs, (cfg.d_model, cfg.d_model), ("embed", None))
        self.transform_bias = params.zeros((cfg.d_model,), (None,)) if cfg.use_bias else None
        self.norm = Norm(cfg)
        self.output = OutputHead(cfg, rngs=rngs, kernel=kernel)
        self.output_bias = params.zeros((cfg.vocab_size,), ("vocab",)) if cfg.use_bias else None

    def __call__(self, x_BTE: jax.Array, embedding: Embedding) -> jax.Array:
        h_BTE = F.dense(x_BTE, self.transform[...], impl=self.matmul_impl)
        if self.transform_bias is not None:
            h_BTE = h_BTE + self.transform_bias[...]
        logits_BTV = self.output(self.norm(ACTIVATIONS[self.activation](h_BTE)), embedding)
        return logits_BTV if self.output_bias is None else logits_BTV + self.output_bias[...]


class Pooler(nnx.Module):
    """BERT's pooler ``[B, T, E] -> [B, E]``: ``tanh(x[:, 0]·w + b)``. Parameters: ``w [E, E]``, ``b [E]``.

    The product computes with ``kernel.matmul_impl``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, kernel: KernelConfig = KernelConfig()):
        self.matmul_impl = kernel.matmul_impl
        self.w = params.normal(rngs, (cfg.d_model, cfg.d_model), ("embed", None))
        self.b = params.zeros((cfg.d_model,), (None,))

    def __call__(self, x_BTE: jax.Array) -> jax.Array:
        return jnp.tanh(F.dense(x_BTE[:, 0], self.w[...], impl=self.matmul_impl) + self.b[...])


class EncoderMLM(nnx.Module):
    """Token embedding (+ positions, token types), ``cfg.num_layers`` bidirectional blocks, masked-LM head.

    ``model(tokens_BT, lengths=None) -> (logits_BTV, aux_loss)``: every position sees
    every (unpadded) position; the logits predict the token at each position. Without a
    head (``cfg.mlm_head=False``) the output is the final hidden states ``[B, T, E]`` instead.
    ``model.encode`` gives the hidden states of any encoder; ``model.pool`` BERT's pooler.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, kernel: KernelConfig = KernelConfig()):
        self.cfg = cfg
        self.embedding = Embedding(cfg, rngs=rngs)
        self.encoder = Stack(cfg, cfg.num_layers, causal=False, rngs=rngs, kernel=kernel)
        self.head = MLMHead(cfg, rngs=rngs, kernel=kernel) if cfg.mlm_head else None
        self.pooler = Pooler(cfg, rngs=rngs, kernel=kernel) if cfg.pooler else None

    def encode(self, tokens_BT: jax.Array, *, lengths: jax.Array | None = None,
               token_types: jax.Array | None = None, drop_tokens: bool = False) -> tuple[jax.Array, jax.Array]:
        """The final hidden states ``[B, T, E]`` (float32 for float32 parameters) and the unweighted MoE aux loss.

        ``lengths [B]``: real tokens per right-padded sequence (padding is never attended to;
        its own rows are computed but meaningless). ``token_types [B, T]``: segment ids (BERT).
        """
        x_BTE = self.embedding(tokens_BT, token_types_BT=token_types)
        hidden_BTE, aux_loss, _ = self.encoder(x_BTE, key_lengths=lengths, drop_tokens=drop_tokens)
        return hidden_BTE, aux_loss

    def pool(self, hidden_BTE: jax.Array) -> jax.Array:
        """BERT's pooled output ``[B, E]`` of :meth:`encode`'s hidden states (needs ``cfg.pooler``)."""
        if self.pooler is None:
            raise ValueError("pooling='pooler' needs a model with BERT's pooler (model.pooler=true)")
        return self.pooler(hidden_BTE)

    def __call__(self, tokens_BT: jax.Array, *, lengths: jax.Array | None = None,
                 token_types: jax.Array | None = None, drop_tokens: bool = False) -> tuple[jax.Array, jax.Array]:
        """``lengths [B]``: real tokens per right-padded sequence. Logits are float32 ``[B, T, V]``.

        The aux loss is the MoE load-balancing loss summed over layers (0.0 if dense),
        *unweighted*: a training objective applies ``cfg.router_aux_loss_weight``.
        ``drop_tokens``: MoE layers drop assignments past ``cfg.capacity_factor`` (training only).
        """
        hidden_BTE, aux_loss = self.encode(tokens_BT, lengths=lengths, token_types=token_types,
                                           drop_tokens=drop_tokens)
        if self.head is None:
            return hidden_BTE.astype(jnp.float32), aux_loss
        return self.head(hidden_BTE, self.embedding).astype(jnp.float32), aux_loss

    def embed(self, tokens_BT: jax.Array, *, lengths: jax.Array | None = None, token_types: jax.Array | None = None,
              pooling: Pooling = "mean", normalize: bool = False) -> jax.Array:
        """One vector ``[B, E]`` per sequence: see `embed`."""
        hidden_BTE, _ = self.encode(tokens_BT, lengths=lengths, token_types=token_types)
        if pooling == "mean":
            pooled_BE = F.mean_pool(hidden_BTE, lengths)
        elif pooling == "first":
            pooled_BE = hidden_BTE[:, 0]
        elif pooling == "pooler":
            pooled_BE = self.pool(hidden_BTE)
        else:
            raise ValueError(f"pooling must be one of mean, first, pooler, got {pooling!r}")
        return F.l2_normalize(pooled_BE) if normalize else pooled_BE


def embed(graphdef: nnx.GraphDef, params_state: nnx.State, tokens_BT: jax.Array, *,
          lengths: jax.Array | None = None, token_types: jax.Array | None = None,
          pooling: Pooling = "mean", normalize: bool = False) -> jax.Array:
    """Sentence embeddings ``[B, E]`` of an encoder (the pure view, like `jaxformer.models.apply`).

    pooling: ``mean`` over each sequence's first ``lengths[b]`` hidden states
      (sentence-transformers' mean pooling), ``first`` (the [CLS] position), or ``pooler``
      (BERT's tanh pooler; needs ``model.pooler``).
    normalize: divide each embedding by its L2 norm (sentence-transformers' ``Normalize``).
    """
    model = nnx.merge(graphdef, params_state)
    if not isinstance(model, EncoderMLM):
        raise ValueError(f"embed needs an encoder model (model.family=encoder), got {model.cfg.family!r}")
    return model.embed(tokens_BT, lengths=lengths, token_types=token_types, pooling=pooling, normalize=normalize)
