"""The attention module: GQA/MQA/MHA against jax.nn.dot_product_attention, cross-attention shapes, impl selection."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.nnx.nn.attention import dot_product_attention_weights
from model_helpers import tiny

import jaxformer.functional as F
from jaxformer.functional import KernelConfig
from jaxformer.models import ModelConfig
from jaxformer.nn import Attention

B, T = 2, 6


def x_BTE(cfg, length=T, seed=1):
    return jax.random.normal(jax.random.key(seed), (B, length, cfg.d_model))


@pytest.mark.parametrize("kv_heads", [1, 4])
def test_self_attention_matches_jax_for_kv_heads_one_and_all(kv_heads):
    cfg = tiny(d_model=32, num_heads=4, num_kv_heads=kv_heads, position="rope", use_bias=True)
    attention = Attention(cfg, causal=True, rngs=nnx.Rngs(0))
    x = x_BTE(cfg)
    out, _ = attention(x)
    q, k, v = attention.queries_keys_values(x)
    assert k.shape == (B, T, kv_heads, cfg.head_dim)
    peer = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    expected = jnp.einsum("bthd,hde->bte", peer, attention.wo[...]) + attention.bo[...]
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_multi_query_equals_multi_head_with_shared_keys_and_values():
    mqa_cfg = tiny(d_model=32, num_heads=4, num_kv_heads=1)
    mqa = Attention(mqa_cfg, causal=True, rngs=nnx.Rngs(0))
    mha = Attention(dataclasses.replace(mqa_cfg, num_kv_heads=4), causal=True, rngs=nnx.Rngs(1))
    mha.wq[...], mha.wo[...] = mqa.wq[...], mqa.wo[...]
    mha.wk[...], mha.wv[...] = (jnp.repeat(w[...], 4, axis=1) for w in (mqa.wk, mqa.wv))
    x = x_BTE(mqa_cfg)
    np.testing.assert_allclose(mqa(x)[0], mha(x)[0], atol=1e-5)


def test_cross_attention_weights_are_m_by_n():
    cfg = tiny(family="encoder_decoder", position="rope")
    cross = Attention(cfg, cross=True, rngs=nnx.Rngs(0))
    queries, context = x_BTE(cfg, length=3), x_BTE(cfg, length=5, seed=2)
    weights = cross.weights(queries, context)
    assert weights.shape == (B, cfg.num_heads, 3, 5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    _, _, v = cross.queries_keys_values(queries, context)
    mixed = jnp.einsum("bhts,bshd->bthd", weights, v)  # K = H here
    expected = jnp.einsum("bthd,hde->bte", mixed, cross.wo[...])
    np.testing.assert_allclose(cross(queries, context_BSE=context)[0], expected, atol=1e-5)
    np.testing.assert_allclose(cross(queries, kv_cache=cross.context_kv(context))[0],
                               cross(queries, context_BSE=context)[0], atol=1e-6)
    with pytest.raises(ValueError, match="cross-attention needs context_BSE or its context_kv"):
        cross(queries)


@pytest.mark.parametrize("impl", ["blockwise", "xla"])
def test_attention_impl_selects_an_equal_implementation(impl):
    cfg = tiny(d_model=32, num_heads=4, num_kv_heads=2, position="alibi", sliding_window=4)
    naive = Attention(cfg, causal=True, rngs=nnx.Rngs(0), kernel=KernelConfig(attention_block_size=4))
    other = Attention(cfg, causal=True, rngs=nnx.Rngs(0),
                      kernel=KernelConfig(attention_impl=impl, attention_block_size=4))
    x = x_BTE(cfg, length=7)
    np.testing.assert_allclose(other(x)[0], naive(x)[0], atol=1e-5)


def test_unknown_attention_impl_is_one_line_error():
    with pytest.raises(ValueError, match=r"kernel.attention_impl must be one of naive, blockwise, xla, fused, auto, got 'flash'"):
        KernelConfig(attention_impl="flash")
    with pytest.raises(TypeError):  # not architecture: ModelConfig has no such field
        ModelConfig(attention_impl="flash")
    q = jnp.zeros((1, 2, 1, 4))
    with pytest.raises(ValueError, match=r"attention_impl must be one of naive, blockwise, xla, fused, got 'flash'"):
        F.attention(q, q, q, impl="flash")


@pytest.mark.parametrize("overrides, causal", [
    (dict(position="rope", num_kv_heads=2, sliding_window=3), True),   # GQA, causal, windowed
    (dict(position="alibi"), True),
    (dict(position="relative_bias"), False),                           # T5's encoder: bidirectional buckets
])
def test_self_attention_weights_are_the_ones_its_forward_mixes(overrides, causal):
    cfg = tiny(d_model=32, num_heads=4, use_bias=True, **overrides)
    attention = Attention(cfg, causal=causal, rngs=nnx.Rngs(0))
    x, lengths = x_BTE(cfg, length=7), jnp.array([7, 4])
    table = (jax.random.normal(jax.random.key(3), (cfg.relative_attention_num_buckets, cfg.num_heads))
             if cfg.position == "relative_bias" else None)
    weights = attention.weights(x, key_lengths=lengths, relative_bias=table)
    q, k, v = attention.queries_keys_values(x)
    if cfg.position == "rope":  # no bias: flax's own weights of the same queries, keys and mask
        mask = F.attention_mask(7, 7, causal=True, window=3, key_lengths=lengths)
        peer = dot_product_attention_weights(q, jnp.repeat(k, 2, axis=2), mask=mask)
        visible = jnp.any(mask, axis=-1, keepdims=True)  # flax spreads a row with no visible key evenly; ours is 0
        np.testing.assert_allclose(weights, jnp.where(visible, peer, 0.0), atol=1e-6)
    if causal:
        assert float(jnp.abs(jnp.triu(weights, 1)).max()) == 0.0
    assert float(jnp.abs(weights[1, :, :, 4:]).max()) == 0.0
    mixed = jnp.einsum("bhts,bshd->bthd", weights, jnp.repeat(v, cfg.num_heads // cfg.num_kv_heads, axis=2))
    expected = jnp.einsum("bthd,hde->bte", mixed, attention.wo[...]) + attention.bo[...]
    out, _ = attention(x, key_lengths=lengths, relative_bias=table)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    with pytest.raises(ValueError, match="self-attention takes no context_BSE"):
        attention.weights(x, x)
