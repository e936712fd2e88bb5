"""`DecoderLM`: the causal language model (GPT-2 style and Llama style, from one `ModelConfig`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import jaxformer.functional as F
from jaxformer.architecture import ModelConfig
from jaxformer.kernel import KernelConfig
from jaxformer.models.kv_cache import KVCache
from jaxformer.nn import params
from jaxformer.nn.block import Stack
from jaxformer.nn.embeddings import Embedding


class OutputHead(nnx.Module):
    """Final features to vocabulary logits: the token embedding transposed (tied) or ``w [E, V]``,
    plus ``bias [V]`` with ``cfg.logit_bias``; the features are first scaled by ``d_model**-0.5``
    with ``cfg.scale_head_inputs`` (T5). The product computes with ``kernel.matmul_impl``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, kernel: KernelConfig = KernelConfig()):
        self.matmul_impl = kernel.matmul_impl
        self.input_scale = cfg.d_model ** -0.5 if cfg.scale_head_inputs else None
        self.w = None if cfg.tie_embeddings else params.normal(rngs, (cfg.d_model, cfg.vocab_size), ("embed", "vocab"))
        self.bias = params.zeros((cfg.vocab_size,), ("vocab",)) if cfg.logit_bias else None

    def __call__(self, x_BTE: jax.Array, embedding: Embedding) -> jax.Array:
        """``[B, T, E] -> [B, T, V]`` float32 logits."""
        if self.input_scale is not None:
            x_BTE = x_BTE * jnp.asarray(self.input_scale, x_BTE.dtype)
        if self.w is None:
            logits_BTV = embedding.attend(x_BTE, matmul_impl=self.matmul_impl)
        else:
            logits_BTV = F.dense(x_BTE, self.w[...], preferred_element_type=jnp.float32, impl=self.matmul_impl)
        return logits_BTV if self.bias is None else logits_BTV + self.bias[...]


class DecoderLM(nnx.Module):
    """Token embedding (+ positions), ``cfg.num_layers`` causal blocks, final norm, output head.

    ``model(tokens_BT) -> (logits_BTV, aux_loss)``; ``model.extend(tokens_BT, cache)``
    is the same computation for new tokens appended to a `KVCache` (prefill and decode).
    MoE layers drop no token unless ``model(tokens_BT, drop_tokens=True)`` (the training
    objective) asks, so the two agree at any ``cfg.capacity_factor``.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, kernel: KernelConfig = KernelConfig()):
        self.cfg = cfg
        self.embedding = Embedding(cfg, rngs=rngs)
        self.decoder = Stack(cfg, cfg.num_layers, causal=True, rngs=rngs, kernel=kernel)
        self.head = OutputHead(cfg, rngs=rngs, kernel=kernel)

    def __call__(self, tokens_BT: jax.Array, *, lengths: jax.Array | None = None,
                 drop_tokens: bool = False) -> tuple[jax.Array, jax.Array]:
        """Logits ``[B, T, V]`` (float32) for next tokens, and the MoE aux loss (0.0 if dense).

        The aux loss is the load-balancing loss summed over layers, *unweighted*: the training
        objective (`jaxformer.train.step.next_token_loss`) applies ``cfg.router_aux_loss_weight``.

        ``lengths [B]``: real tokens per sequence when right-padded (keys past them are hidden).
        ``drop_tokens``: MoE layers drop assignments past ``cfg.capacity_factor`` (training only).
        """
        x_BTE = self.embedding(tokens_BT)
        x_BTE, aux_loss, _ = self.decoder(x_BTE, key_lengths=lengths, drop_tokens=drop_tokens)
        return self.head(x_BTE, self.embedding), aux_loss

    def extend(self, tokens_BT: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """Appends ``tokens_BT`` at positions ``cache.length …``: their logits ``[B, T, V]`` and the new cache.

        MoE layers never drop here (as in ``model(tokens)``), prefill or one-token step.

        The caller keeps ``cache.length + T`` within the ``max_len`` the cache was created for
        (`jaxformer.generate` checks it).
        """
        x_BTE = self.embedding(tokens_BT, offset=cache.length)
        x_BTE, _, layers = self.decoder(x_BTE, offset=cache.length, kv_caches=cache.layers())
        return self.head(x_BTE, self.embedding), cache.advanced(layers, tokens_BT.shape[1])
