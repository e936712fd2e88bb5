"""`EncoderDecoder`: the original transformer / T5 layout, a decoder cross-attending to an encoder."""

from __future__ import annotations

import jax
from flax import nnx

from jaxformer.architecture import ModelConfig
from jaxformer.kernel import KernelConfig
from jaxformer.models.decoder import OutputHead
from jaxformer.models.kv_cache import KVCache
from jaxformer.nn.block import Stack
from jaxformer.nn.embeddings import Embedding


class EncoderDecoder(nnx.Module):
    """Shared token embedding (+ positions); ``cfg.num_encoder_layers`` bidirectional blocks;
    ``cfg.num_layers`` causal blocks with cross-attention over the encoder output; output head.

    ``model(source_BS, target_BT) -> (logits_BTV, aux_loss)``: logits for the token after
    each target position (teacher forcing: feed the target shifted right).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, kernel: KernelConfig = KernelConfig()):
        self.cfg = cfg
        self.embedding = Embedding(cfg, rngs=rngs)
        self.encoder = Stack(cfg, cfg.num_encoder_layers, causal=False, rngs=rngs, kernel=kernel)
        self.decoder = Stack(cfg, cfg.num_layers, causal=True, cross=True, rngs=rngs, kernel=kernel)
        self.head = OutputHead(cfg, rngs=rngs, kernel=kernel)

    def encode(self, source_BS: jax.Array, *, source_lengths: jax.Array | None = None,
               drop_tokens: bool = False) -> tuple[jax.Array, jax.Array]:
        """Encoder output ``[B, S, E]`` and its unweighted MoE aux loss (``drop_tokens`` as in ``__call__``)."""
        memory_BSE, aux_loss, _ = self.encoder(self.embedding(source_BS), key_lengths=source_lengths,
                                               drop_tokens=drop_tokens)
        return memory_BSE, aux_loss

    def __call__(
        self,
        source_BS: jax.Array,
        target_BT: jax.Array,
        *,
        source_lengths: jax.Array | None = None,
        target_lengths: jax.Array | None = None,
        drop_tokens: bool = False,
    ) -> tuple[jax.Array, jax.Array]:
        """``*_lengths [B]``: real tokens per right-padded sequence. Logits are float32 ``[B, T, V]``.

        The aux loss is the MoE load-balancing loss summed over encoder and decoder layers
        (0.0 if dense), *unweighted*: a training objective applies ``cfg.router_aux_loss_weight``.
        ``drop_tokens``: MoE layers drop assignments past ``cfg.capacity_factor`` (training
        only); without it the logits equal those of cached decoding (:meth:`extend`).
        """
        memory_BSE, encoder_aux = self.encode(source_BS, source_lengths=source_lengths, drop_tokens=drop_tokens)
        x_BTE, decoder_aux, _ = self.decoder(
            self.embedding(target_BT), key_lengths=target_lengths, context_BSE=memory_BSE,
            context_lengths=source_lengths, drop_tokens=drop_tokens,
        )
        return self.head(x_BTE, self.embedding), encoder_aux + decoder_aux

    def context_kvs(self, source_BS: jax.Array, *, source_lengths: jax.Array | None = None) -> tuple:
        """Encodes the source once and returns each decoder layer's cross-attention ``(k, v)``, ``[B, S, K, D]``."""
        memory_BSE, _ = self.encode(source_BS, source_lengths=source_lengths)
        return self.decoder.context_kvs(memory_BSE)

    def extend(
        self, target_BT: jax.Array, context_kvs: tuple, cache: KVCache, *, source_lengths: jax.Array | None = None
    ) -> tuple[jax.Array, KVCache]:
        """Appends target tokens at ``cache.length …`` given :meth:`context_kvs`: logits ``[B, T, V]``, new cache."""
        x_BTE, _, layers = self.decoder(
            self.embedding(target_BT, offset=cache.length), offset=cache.length, kv_caches=cache.layers(),
            context_kvs=context_kvs, context_lengths=source_lengths,
        )
        return self.head(x_BTE, self.embedding), cache.advanced(layers, target_BT.shape[1])
