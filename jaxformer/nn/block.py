"""`Block` (one transformer layer) and `Stack` (layers plus the final norm).

Norm placement (``cfg.norm_position``), for each sublayer ``f`` (self-attention,
cross-attention, FFN/MoE):

- ``pre`` (GPT-2, Llama):  ``x + f(norm(x))``; the stack ends with a final norm;
- ``post`` (original transformer, BERT): ``norm(x + f(x))``; no final norm;
- ``sandwich`` (CogView, Gemma 2): ``x + norm_out(f(norm_in(x)))``; final norm.

With ``position: relative_bias`` (T5) the stack owns one ``relative_bias [P, H]`` table that
every layer's self-attention adds (T5 keeps it in its first layer and shares it the same way).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.architecture import ModelConfig
from jaxformer.kernel import KernelConfig
from jaxformer.nn import params
from jaxformer.nn.attention import Attention
from jaxformer.nn.feedforward import FeedForward
from jaxformer.nn.kv import KV
from jaxformer.nn.moe import MoE
from jaxformer.nn.norms import Norm


def _norms(cfg: ModelConfig) -> nnx.List:
    return nnx.List([Norm(cfg) for _ in range(2 if cfg.norm_position == "sandwich" else 1)])


class Block(nnx.Module):
    """One layer ``[B, T, E] -> [B, T, E]``: self-attention, optional cross-attention, FFN or MoE.

    ``causal``: self-attention sees only earlier positions (decoders). ``cross``: a
    cross-attention sublayer over a context (the decoder of an encoder–decoder).
    """

    def __init__(self, cfg: ModelConfig, *, causal: bool, cross: bool = False, rngs: nnx.Rngs,
                 kernel: KernelConfig = KernelConfig(), depth: int | None = None):
        self.position = cfg.norm_position
        self.attention = Attention(cfg, causal=causal, rngs=rngs, kernel=kernel, depth=depth)
        self.attention_norms = _norms(cfg)
        self.cross_attention = Attention(cfg, cross=True, rngs=rngs, kernel=kernel, depth=depth) if cross else None
        self.cross_attention_norms = _norms(cfg) if cross else None
        self.feed_forward = (MoE(cfg, rngs=rngs, kernel=kernel, depth=depth) if cfg.is_moe
                             else FeedForward(cfg, rngs=rngs, kernel=kernel, depth=depth))
        self.feed_forward_norms = _norms(cfg)

    def _residual(self, x_BTE: jax.Array, norms: nnx.List, sublayer: Callable) -> tuple[jax.Array, object]:
        """Applies ``sublayer`` (returning ``(y, extra)``) with this block's norm placement."""
        if self.position == "post":
            y_BTE, extra = sublayer(x_BTE)
            return norms[0](x_BTE + y_BTE), extra
        y_BTE, extra = sublayer(norms[0](x_BTE))
        return x_BTE + (norms[1](y_BTE) if self.position == "sandwich" else y_BTE), extra

    def __call__(
        self,
        x_BTE: jax.Array,
        *,
        key_lengths: jax.Array | None = None,
        offset: int | jax.Array = 0,
        kv_cache: KV | None = None,
        context_BSE: jax.Array | None = None,
        context_kv: KV | None = None,
        context_lengths: jax.Array | None = None,
        drop_tokens: bool = False,
        relative_bias: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array, KV | None]:
        """Returns ``(x [B, T, E], aux_loss, kv_cache)``; see `Attention` for the arguments.

        The cross-attention sublayer reads ``context_BSE`` or, when decoding, its
        precomputed ``context_kv``. ``drop_tokens``: the MoE sublayer drops assignments past
        ``cfg.capacity_factor`` (training only; see `MoE`); dense layers ignore it.
        ``relative_bias``: the stack's T5 bias table, for self-attention only.
        """
        x_BTE, kv_cache = self._residual(
            x_BTE, self.attention_norms,
            lambda h: self.attention(h, key_lengths=key_lengths, offset=offset, kv_cache=kv_cache,
                                     relative_bias=relative_bias),
        )
        if self.cross_attention is not None:
            x_BTE, _ = self._residual(
                x_BTE, self.cross_attention_norms,
                lambda h: self.cross_attention(h, context_BSE=context_BSE, key_lengths=context_lengths,
                                               kv_cache=context_kv),
            )
        if isinstance(self.feed_forward, MoE):
            x_BTE, aux_loss = self._residual(x_BTE, self.feed_forward_norms,
                                             lambda h: self.feed_forward(h, drop_tokens=drop_tokens))
        else:
            x_BTE, _ = self._residual(x_BTE, self.feed_forward_norms, lambda h: (self.feed_forward(h), None))
            aux_loss = jnp.zeros((), jnp.float32)
        return x_BTE, aux_loss, kv_cache


class Stack(nnx.Module):
    """``num_layers`` blocks and, for pre-norm and sandwich, a final norm; with ``position:
    relative_bias``, the ``relative_bias [P, H]`` table (``P`` buckets) its blocks share.

    Returns the summed per-layer MoE aux losses, unweighted (0 for dense layers).
    """

    def __init__(self, cfg: ModelConfig, num_layers: int, *, causal: bool, cross: bool = False, rngs: nnx.Rngs,
                 kernel: KernelConfig = KernelConfig()):
        # the residual projections' init scales with this stack's depth (an encoder's, not its decoder's)
        self.blocks = nnx.List([Block(cfg, causal=causal, cross=cross, rngs=rngs, kernel=kernel, depth=num_layers)
                                for _ in range(num_layers)])
        self.final_norm = Norm(cfg) if cfg.has_final_norm else None
        self.relative_bias = (params.normal(rngs, (cfg.relative_attention_num_buckets, cfg.num_heads),
                                            ("position", "heads"))
                              if cfg.position == "relative_bias" else None)

    def __call__(
        self,
        x_BTE: jax.Array,
        *,
        kv_caches: tuple[KV, ...] | None = None,
        context_kvs: tuple[KV, ...] | None = None,
        **kwargs,
    ) -> tuple[jax.Array, jax.Array, tuple[KV, ...] | None]:
        """``x [B, T, E] -> (y [B, T, E], aux_loss, caches)``: ``aux_loss`` the float32 scalar sum of the layers'
        MoE losses; ``caches`` the updated ``kv_caches`` (None without them).

        ``kwargs`` go to every `Block`; ``kv_caches`` (self-attention) and ``context_kvs``
        (cross-attention, see :meth:`context_kvs`) hold one ``(k, v)`` per layer: ``[B, slots, K, D]`` caches,
        ``[B, S, K, D]`` context keys and values."""
        aux_total = jnp.zeros((), jnp.float32)
        new_caches = []
        relative_bias = None if self.relative_bias is None else self.relative_bias[...]
        for i, block in enumerate(self.blocks):
            x_BTE, aux_loss, kv = block(x_BTE, kv_cache=None if kv_caches is None else kv_caches[i],
                                        context_kv=None if context_kvs is None else context_kvs[i],
                                        relative_bias=relative_bias, **kwargs)
            aux_total = aux_total + aux_loss
            new_caches.append(kv)
        if self.final_norm is not None:
            x_BTE = self.final_norm(x_BTE)
        return x_BTE, aux_total, None if kv_caches is None else tuple(new_caches)

    def context_kvs(self, context_BSE: jax.Array) -> tuple[KV, ...]:
        """Every layer's cross-attention keys and values of ``context_BSE``, computed once per decode."""
        return tuple(block.cross_attention.context_kv(context_BSE) for block in self.blocks)
