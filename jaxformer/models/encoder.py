"""`EncoderMLM`: the bidirectional encoder with BERT's masked-LM head."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import jaxformer.functional as F
from jaxformer.architecture import ModelConfig
from jaxformer.functional.kernel import KernelConfig
from jaxformer.models.decoder import OutputHead
from jaxformer.nn import params
from jaxformer.nn.block import Stack
from jaxformer.nn.embeddings import Embedding
from jaxformer.nn.norms import Norm


class MLMHead(nnx.Module):
    """BERT's prediction head: dense ``[E, E]`` (+ bias), GELU, norm, vocabulary projection (+ ``bias [V]``)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.transform = params.normal(rngs, (cfg.d_model, cfg.d_model), ("embed", None))
        self.transform_bias = params.zeros((cfg.d_model,), (None,)) if cfg.use_bias else None
        self.norm = Norm(cfg)
        self.output = OutputHead(cfg, rngs=rngs)
        self.output_bias = params.zeros((cfg.vocab_size,), ("vocab",)) if cfg.use_bias else None

    def __call__(self, x_BTE: jax.Array, embedding: Embedding) -> jax.Array:
        h_BTE = F.dense(x_BTE, self.transform[...])
        if self.transform_bias is not None:
            h_BTE = h_BTE + self.transform_bias[...]
        logits_BTV = self.output(self.norm(jax.nn.gelu(h_BTE, approximate=False)), embedding)
        return logits_BTV if self.output_bias is None else logits_BTV + self.output_bias[...]


class EncoderMLM(nnx.Module):
    """Token embedding (+ positions), ``cfg.num_layers`` bidirectional blocks, masked-LM head.

    ``model(tokens_BT, lengths=None) -> (logits_BTV, aux_loss)``: every position sees
    every (unpadded) position; the logits predict the token at each position.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, kernel: KernelConfig = KernelConfig()):
        self.cfg = cfg
        self.embedding = Embedding(cfg, rngs=rngs)
        self.encoder = Stack(cfg, cfg.num_layers, causal=False, rngs=rngs, kernel=kernel)
        self.head = MLMHead(cfg, rngs=rngs)

    def __call__(self, tokens_BT: jax.Array, *, lengths: jax.Array | None = None,
                 drop_tokens: bool = False) -> tuple[jax.Array, jax.Array]:
        """``lengths [B]``: real tokens per right-padded sequence. Logits are float32 ``[B, T, V]``.

        The aux loss is the MoE load-balancing loss summed over layers (0.0 if dense),
        *unweighted*: a training objective applies ``cfg.router_aux_loss_weight``.
        ``drop_tokens``: MoE layers drop assignments past ``cfg.capacity_factor`` (training only).
        """
        x_BTE, aux_loss, _ = self.encoder(self.embedding(tokens_BT), key_lengths=lengths, drop_tokens=drop_tokens)
        return self.head(x_BTE, self.embedding).astype(jnp.float32), aux_loss
