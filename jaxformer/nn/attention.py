"""`Attention`: multi-head, grouped-query and multi-query attention; self or cross; with a KV cache.

The module owns the projections; masks, biases and the softmax come from the
dispatcher ``jaxformer.functional.attention`` through one call with structured
arguments (causal flag, query offset, valid key lengths, window, ALiBi slopes, T5's
relative bias table), so the implementation (``kernel.attention_impl``: naive | blockwise |
xla) is chosen there.

Shape letters (``x_BTE``, ``q_BTHD``, ``k_BSKD``) follow the legend of :mod:`jaxformer.functional`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxformer.functional as F
from jaxformer.kernel import KernelConfig
from jaxformer.architecture import ModelConfig
from jaxformer.functional.dispatch import attention_bias
from jaxformer.nn import kv, params
from jaxformer.nn.kv import KV


class Attention(nnx.Module):
    """Attention sublayer ``[B, T, E] -> [B, T, E]``.

    Parameters: ``wq [E, H, D]``, ``wk, wv [E, K, D]``, ``wo [H, D, E]``; with
    ``cfg.has_qkv_bias`` (``use_bias`` unless ``qkv_bias`` says otherwise) also ``bq [H, D]``,
    ``bk, bv [K, D]``, and with ``cfg.use_bias`` ``bo [E]``. ``causal``: a
    query sees only keys at its position or before (and, with ``cfg.sliding_window``,
    only the last ``sliding_window`` of them). ``cross=True`` makes keys and values
    come from a context (the encoder output), never causal, with no position signal.
    Scores are scaled by ``cfg.attention_scale`` (None: ``1/√D``). With ``position:
    relative_bias`` self-attention adds T5's bias from the ``[P, H]`` table its `Stack` owns and
    passes in (``relative_bias``); buckets are bidirectional unless the attention is causal.
    """

    def __init__(self, cfg: ModelConfig, *, causal: bool = False, cross: bool = False, rngs: nnx.Rngs,
                 kernel: KernelConfig = KernelConfig(), depth: int | None = None):
        E, H, K, D = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg, self.kernel, self.cross, self.causal = cfg, kernel, cross, causal and not cross
        self.wq = params.normal(rngs, (E, H, D), ("embed", "heads", "head_dim"))
        self.wk = params.normal(rngs, (E, K, D), ("embed", "kv_heads", "head_dim"))
        self.wv = params.normal(rngs, (E, K, D), ("embed", "kv_heads", "head_dim"))
        out_std = params.residual_std(depth or cfg.num_layers)  # depth: the layers of its stack
        self.wo = params.normal(rngs, (H, D, E), ("heads", "head_dim", "embed"), std=out_std)
        bias = cfg.has_qkv_bias
        self.bq = params.zeros((H, D), ("heads", "head_dim")) if bias else None
        self.bk = params.zeros((K, D), ("kv_heads", "head_dim")) if bias else None
        self.bv = params.zeros((K, D), ("kv_heads", "head_dim")) if bias else None
        self.bo = params.zeros((E,), ("embed",)) if cfg.use_bias else None
        llama3 = (cfg.rope_scaling_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
                  cfg.rope_original_max_seq_len) if cfg.rope_scaling == "llama3" else None
        # static floats (a constant of the program, like the cos/sin tables `F.apply_rope` builds from them)
        self.rope_frequencies = (tuple(float(w) for w in F.rope_frequencies(D, cfg.rope_base, llama3=llama3))
                                 if cfg.position == "rope" and llama3 else None)

    def _project(self, x_BTE: jax.Array, w, b) -> jax.Array:
        y = F.dense(x_BTE, w[...], impl=self.kernel.matmul_impl)
        return y if b is None else y + b[...]

    def _rope(self, x_BTHD: jax.Array, offset) -> jax.Array:
        if self.cfg.position != "rope" or self.cross:
            return x_BTHD
        positions_T = offset + np.arange(x_BTHD.shape[1])  # numpy: concrete unless the offset is traced
        return F.apply_rope(x_BTHD, positions_T, base=self.cfg.rope_base, scale=self.cfg.rope_scale,
                            frequencies=None if self.rope_frequencies is None else np.asarray(
                                self.rope_frequencies, np.float32))

    def _check_relative_bias(self, relative_bias: jax.Array | None) -> None:
        if (self.cfg.position == "relative_bias" and not self.cross) != (relative_bias is not None):
            raise ValueError("position relative_bias: self-attention needs the stack's relative_bias table, "
                             "cross-attention and other positions take none")

    def queries_keys_values(self, x_BTE: jax.Array, context_BSE: jax.Array | None = None, *,
                            offset: int | jax.Array = 0) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``q [B, T, H, D]``, ``k, v [B, S, K, D]`` with RoPE applied at positions ``offset + t``."""
        source_BSE = x_BTE if context_BSE is None else context_BSE
        q_BTHD = self._rope(self._project(x_BTE, self.wq, self.bq), offset)
        k_BSKD = self._rope(self._project(source_BSE, self.wk, self.bk), offset)
        return q_BTHD, k_BSKD, self._project(source_BSE, self.wv, self.bv)

    def context_kv(self, context_BSE: jax.Array) -> KV:
        """Cross-attention keys and values ``[B, S, K, D]`` of a context, computed once for a whole decode."""
        return self._project(context_BSE, self.wk, self.bk), self._project(context_BSE, self.wv, self.bv)

    def __call__(
        self,
        x_BTE: jax.Array,
        *,
        context_BSE: jax.Array | None = None,
        key_lengths: jax.Array | None = None,
        offset: int | jax.Array = 0,
        kv_cache: KV | None = None,
        relative_bias: jax.Array | None = None,
    ) -> tuple[jax.Array, KV | None]:
        """Returns ``(out [B, T, E], kv_cache)``.

        context_BSE: keys/values source for cross-attention (cross-attention needs it or
          ``kv_cache``; self-attention takes none).
        key_lengths: ``[B]`` valid keys per sequence (padding is on the right); with a
          self-attention cache, the cache decides which keys are valid instead.
        offset: absolute position of ``x``'s first token (the cache length when decoding).
        kv_cache: self-attention: the new keys/values are written at ``offset``, the
          queries attend to the cached positions (`jaxformer.nn.kv`: linear or ring
          layout), and the updated cache is returned. Cross-attention: the context's
          keys/values from :meth:`context_kv`, used as they are and returned unchanged.
          ``None``: nothing cached.
        relative_bias: ``[P, H]`` T5 bias table (self-attention of a ``position: relative_bias``
          model, which needs it; cross-attention takes none).
        """
        if self.cross and context_BSE is None and kv_cache is None:
            raise ValueError("cross-attention needs context_BSE or its context_kv")
        if not self.cross and context_BSE is not None:
            raise ValueError("self-attention takes no context_BSE")
        cfg = self.cfg
        self._check_relative_bias(relative_bias)
        q_offset, supported = (0 if self.cross else offset), None
        if self.cross and kv_cache is not None:
            (k_BSKD, v_BSKD), q_BTHD = kv_cache, self._project(x_BTE, self.wq, self.bq)
        else:
            q_BTHD, k_BSKD, v_BSKD = self.queries_keys_values(x_BTE, context_BSE, offset=offset)
        if kv_cache is not None and not self.cross:
            view = kv.update(kv_cache, k_BSKD, v_BSKD, offset, window=cfg.sliding_window)
            kv_cache, k_BSKD, v_BSKD = view.cache, view.k, view.v
            q_offset, key_lengths, supported = view.q_offset, view.key_lengths, view.supported
        alibi = cfg.position == "alibi" and not self.cross
        out_BTHD = F.attention(
            q_BTHD, k_BSKD.astype(q_BTHD.dtype), v_BSKD.astype(q_BTHD.dtype),
            causal=self.causal,
            q_offset=q_offset,
            key_lengths=key_lengths,
            window=cfg.sliding_window if self.causal else None,
            alibi_slopes=F.alibi_slopes(cfg.num_heads) if alibi else None,
            relative_bias=relative_bias,
            relative_bidirectional=not self.causal,
            relative_max_distance=cfg.relative_attention_max_distance,
            scale=cfg.attention_scale,
            **self.kernel.attention_options(),
        )
        if supported is not None:
            out_BTHD = jnp.where(supported, out_BTHD, jnp.nan)
        out_BTE = F.dense(out_BTHD, self.wo[...], in_axes=2, impl=self.kernel.matmul_impl)
        return (out_BTE if self.bo is None else out_BTE + self.bo[...]), kv_cache

    def weights(self, x_BTE: jax.Array, context_BSE: jax.Array | None = None, *, key_lengths: jax.Array | None = None,
                relative_bias: jax.Array | None = None) -> jax.Array:
        """The softmax weights ``[B, H, T, S]`` that :meth:`__call__` (no cache) mixes the values with.

        Cross-attention: over the ``S`` positions of ``context_BSE``. Self-attention (no
        ``context_BSE``; ``S = T``): with the module's causal mask and sliding window, its ALiBi
        bias, and T5's bias from ``relative_bias`` (the stack's table, as in :meth:`__call__`).
        ``key_lengths [B]`` hides padded keys. Rows sum to one over their visible keys; a row
        with none is zeros.
        """
        if self.cross and context_BSE is None:
            raise ValueError("cross-attention weights need context_BSE")
        if not self.cross and context_BSE is not None:
            raise ValueError("self-attention takes no context_BSE")
        cfg = self.cfg
        self._check_relative_bias(relative_bias)
        q_BTHD, k_BSKD, v_BSKD = self.queries_keys_values(x_BTE, context_BSE)
        T, S = q_BTHD.shape[1], k_BSKD.shape[1]
        mask_B1TS = F.attention_mask(T, S, causal=self.causal, window=cfg.sliding_window if self.causal else None,
                                     key_lengths=key_lengths)
        alibi = cfg.position == "alibi" and not self.cross
        bias_HTS = attention_bias(T, S, alibi_slopes=F.alibi_slopes(cfg.num_heads) if alibi else None,
                                  relative_bias=relative_bias, relative_bidirectional=not self.causal,
                                  relative_max_distance=cfg.relative_attention_max_distance)
        return F.dot_product_attention(q_BTHD, k_BSKD, v_BSKD, mask=mask_B1TS, bias=bias_HTS, scale=cfg.attention_scale,
                                       return_weights=True)[1]
