"""The functional layers against their peers (jax.nn, PyTorch, transformers, sentence-transformers): attention,
masks, positions, norms, sampling, pooling; bad input; transforms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxformer.functional as F

CASES = [  # (batch, q_len, k_len, heads, kv_heads, head_dim, mask kind)
    (2, 7, 7, 4, 4, 8, "causal"),
    (1, 5, 9, 6, 2, 16, "padding"),   # cross-attention, GQA
    (3, 6, 6, 8, 1, 4, "window"),     # MQA
    (2, 4, 11, 4, 2, 8, "none"),
]


def _inputs(case, seed=0):
    b, t, s, h, kv, d, kind = case
    kq, kk, kvv, kl = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(kq, (b, t, h, d))
    k = jax.random.normal(kk, (b, s, kv, d))
    v = jax.random.normal(kvv, (b, s, kv, d))
    mask = {
        "causal": F.causal_mask(t, s)[None, None],
        "padding": F.padding_mask(jax.random.randint(kl, (b,), 1, s + 1), s),
        "window": F.sliding_window_mask(t, s, 3)[None, None],
        "none": None,
    }[kind]
    return q, k, v, mask


@pytest.mark.parametrize("case", CASES, ids=[c[-1] for c in CASES])
def test_matches_jax_nn_dot_product_attention(case):
    q, k, v, mask = _inputs(case)
    ours = F.dot_product_attention(q, k, v, mask=mask)
    peer = jax.nn.dot_product_attention(q, k, v, mask=None if mask is None else jnp.broadcast_to(mask, (q.shape[0], q.shape[2], q.shape[1], k.shape[1])))
    assert float(jnp.abs(ours - peer).max()) <= 1e-5


@pytest.mark.parametrize("case", CASES, ids=[c[-1] for c in CASES])
def test_matches_pytorch_scaled_dot_product_attention(case):
    q, k, v, mask = _inputs(case, seed=1)
    ours = np.asarray(F.dot_product_attention(q, k, v, mask=mask))
    to_torch = lambda x: torch.from_numpy(np.array(x)).transpose(1, 2)  # [B, H, T, D]
    torch_mask = None if mask is None else torch.from_numpy(np.array(mask))
    peer = torch.nn.functional.scaled_dot_product_attention(
        to_torch(q), to_torch(k), to_torch(v), attn_mask=torch_mask, dropout_p=0.0, enable_gqa=True
    ).transpose(1, 2).numpy()
    assert np.abs(ours - peer).max() <= 1e-5


def test_fully_masked_row_gives_zeros_and_finite_gradients():
    q, k, v, _ = _inputs(CASES[0])
    mask = F.causal_mask(7).at[3].set(False)[None, None]

    def loss(q, k, v):
        return jnp.sum(F.dot_product_attention(q, k, v, mask=mask) ** 2)

    out = F.dot_product_attention(q, k, v, mask=mask)
    assert float(jnp.abs(out[:, 3]).max()) == 0.0
    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    assert all(bool(jnp.isfinite(g).all()) for g in grads)


@pytest.mark.parametrize("impl", ["naive", "blockwise", "xla", "fused"])
def test_no_keys_or_no_queries_give_what_jax_nn_gives(impl):
    q, k, v = jnp.ones((1, 2, 2, 4)), jnp.ones((1, 0, 2, 4)), jnp.ones((1, 0, 2, 4))
    ours = F.attention(q, k, v, impl=impl)
    assert ours.shape == (1, 2, 2, 4) and bool((ours == jax.nn.dot_product_attention(q, k, v)).all())  # zeros
    assert F.attention(jnp.ones((1, 0, 2, 4)), q, q, impl=impl, causal=True).shape == (1, 0, 2, 4)


def test_jit_vmap_and_grad_agree_with_eager():
    q, k, v, mask = _inputs(CASES[1])
    eager = F.dot_product_attention(q, k, v, mask=mask)
    jitted = jax.jit(lambda q, k, v: F.dot_product_attention(q, k, v, mask=mask))(q, k, v)
    per_example = jax.vmap(lambda q, k, v, m: F.dot_product_attention(q, k, v, mask=m))(q, k, v, mask)
    np.testing.assert_allclose(jitted, eager, atol=1e-6)
    np.testing.assert_allclose(per_example, eager, atol=1e-6)
    grad = jax.grad(lambda q: F.dot_product_attention(q, k, v, mask=mask).sum())(q)
    assert grad.shape == q.shape and bool(jnp.isfinite(grad).all())


@pytest.mark.parametrize("impl", ["xla", "onednn"])
def test_dense_with_an_empty_axis_is_what_jnp_matmul_gives(impl):
    """An empty contraction sums nothing (zeros); no rows or no columns give an empty result; gradients keep shapes."""
    for x_shape, w_shape, in_axes, out_shape in (((4, 0), (0, 5), 1, (4, 5)), ((2, 3, 0, 2), (0, 2, 5), 2, (2, 3, 5)),
                                                 ((0, 8), (8, 5), 1, (0, 5)), ((2, 0, 3), (3, 4), 1, (2, 0, 4))):
        x, w = jnp.ones(x_shape), jnp.ones(w_shape)
        out = F.dense(x, w, in_axes=in_axes, impl=impl)
        assert out.shape == out_shape and bool((out == 0).all())
        grads = jax.grad(lambda x, w: F.dense(x, w, in_axes=in_axes, impl=impl).sum(), argnums=(0, 1))(x, w)
        assert [g.shape for g in grads] == [x_shape, w_shape] and all(bool((g == 0).all()) for g in grads)


@pytest.mark.parametrize("kv_heads", [4, 0])  # 0 heads: the same error, not a modulo by zero
def test_head_counts_that_do_not_divide_name_both_counts(kv_heads):
    q = jnp.zeros((1, 4, 6, 8))
    kv = jnp.zeros((1, 4, kv_heads, 8))
    with pytest.raises(ValueError, match=rf"query heads \(6\).*key/value heads \({kv_heads}\)"):
        F.dot_product_attention(q, kv, kv)


@pytest.mark.parametrize(
    ("q_shape", "k_shape", "message"),
    [((4, 8), (4, 8), "q must have shape"), ((1, 4, 2, 8), (1, 4, 2), "rank"),
     ((1, 4, 2, 8), (1, 5, 2, 4), "q and k head_dim differ: 8 vs 4"),
     ((2, 4, 2, 8), (1, 4, 2, 8), "q and k batch sizes differ: 2 vs 1")],
)
def test_wrong_shapes_raise_value_errors(q_shape, k_shape, message):
    with pytest.raises(ValueError, match=message):
        F.dot_product_attention(jnp.zeros(q_shape), jnp.zeros(k_shape), jnp.zeros(k_shape))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: F.causal_mask(0), "q_len"),
        (lambda: F.sliding_window_mask(4, 4, 0), "window"),
        (lambda: F.sinusoidal_positions(8, 5), "dim"),
        (lambda: F.apply_rope(jnp.zeros((4, 2, 6)), jnp.arange(3)), "positions length 3"),
        (lambda: F.alibi_slopes(0), "num_heads"),
        (lambda: F.sampling_distribution(jnp.zeros(4), top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
        (lambda: F.sampling_distribution(jnp.zeros(4), top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),  # no token
        (lambda: F.sampling_distribution(jnp.zeros(4), top_k=9), "top_k"),
        (lambda: F.sampling_distribution(jnp.zeros(4), top_k=2.0), "top_k must be an integer in .1, 4., got 2.0"),
        (lambda: F.sampling_distribution(jnp.zeros(4), temperature=float("nan")), "temperature must be >= 0, got nan"),
        (lambda: F.feed_forward(jnp.zeros((2, 4)), jnp.zeros((4, 8)), jnp.zeros((8, 4)), activation="tanh"), "tanh"),
        # T5's log bins divide by log(max_distance / exact): at max_distance = exact (8 causal buckets: 4 exact) by 0
        (lambda: F.relative_position_buckets(jnp.arange(3), num_buckets=8, max_distance=4, bidirectional=False),
         r"8 per direction need max_distance above 4 and at least 2 buckets, got max_distance=4"),
        (lambda: F.relative_position_buckets(jnp.arange(3), num_buckets=2, max_distance=4, bidirectional=True),
         r"1 per direction need max_distance above 0 and at least 2 buckets, got max_distance=4"),
        # rotary pairs: an odd head width has a coordinate left over
        (lambda: F.rope_frequencies(7), "head_dim must be a positive even number, got 7"),
        (lambda: F.apply_rope(jnp.zeros((4, 2, 7)), jnp.arange(4)), "head_dim must be a positive even number, got 7"),
    ],
)
def test_bad_arguments_name_the_argument_and_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_relative_position_buckets_take_max_distance_one_past_the_exact_buckets():
    buckets = F.relative_position_buckets(jnp.arange(7), num_buckets=8, max_distance=5, bidirectional=False)
    np.testing.assert_array_equal(buckets, [0, 1, 2, 3, 4, 7, 7])  # 0-3 exact, 4 a bin, 5 and beyond the last


def test_norms_match_their_definitions_and_swiglu_gates():
    x = jax.random.normal(jax.random.key(3), (2, 5, 16))
    ln = F.layer_norm(x)
    np.testing.assert_allclose(ln.mean(-1), 0.0, atol=1e-6)
    np.testing.assert_allclose(ln.std(-1), 1.0, atol=1e-3)
    rms = F.rms_norm(x, scale=2.0 * jnp.ones(16))
    np.testing.assert_allclose(jnp.sqrt(jnp.mean(rms ** 2, -1)), 2.0, atol=1e-4)
    # PyTorch's, with a scale and a bias: on rows off zero mean (RMSNorm keeps the mean, LayerNorm removes it), and on
    # rows whose variance, 9e-6, is of the order of eps (layer_norm's default 1e-5, rms_norm's 1e-6, as torch is called)
    rows = np.array([[1.0, 0.5], [3e-3, 0.0]], np.float32)  # each batch row's scale and offset
    shifted = np.asarray(x) * rows[:, :1, None] + rows[:, 1:, None]
    scale, bias = np.asarray(jax.random.normal(jax.random.key(6), (2, 16)))
    to_torch = lambda a: torch.from_numpy(np.array(a))
    for ours, theirs in ((F.layer_norm(jnp.asarray(shifted), jnp.asarray(scale), jnp.asarray(bias)),
                          torch.nn.functional.layer_norm(to_torch(shifted), (16,), to_torch(scale), to_torch(bias),
                                                         eps=1e-5)),
                         (F.rms_norm(jnp.asarray(shifted), jnp.asarray(scale)),
                          torch.nn.functional.rms_norm(to_torch(shifted), (16,), to_torch(scale), eps=1e-6))):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5, atol=1e-5)
    w_in, w_gate, w_out = jax.random.normal(jax.random.key(4), (3, 16, 16))
    gated = F.feed_forward(x, w_in, w_out, activation="swiglu", w_gate_EF=w_gate)
    np.testing.assert_allclose(gated, (jax.nn.silu(x @ w_gate) * (x @ w_in)) @ w_out, rtol=1e-5, atol=1e-5)
    gelu = torch.nn.functional.gelu(torch.from_numpy(np.array(x @ w_in))).numpy() @ np.asarray(w_out)
    np.testing.assert_allclose(F.feed_forward(x, w_in, w_out, activation="gelu"), gelu, rtol=1e-4, atol=1e-4)


def test_sampling_greedy_top_k_and_nucleus():
    logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    assert int(F.sample_logits(jax.random.key(0), logits, temperature=0.0)) == 0
    np.testing.assert_allclose(F.sampling_distribution(logits, top_k=2), [0.625, 0.375, 0, 0], atol=1e-6)
    np.testing.assert_allclose(F.sampling_distribution(logits, top_p=0.8), [0.625, 0.375, 0, 0], atol=1e-6)
    np.testing.assert_allclose(F.sampling_distribution(logits, top_p=0.81), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0],
                               atol=1e-6)
    draws = F.sample_logits(jax.random.key(1), jnp.broadcast_to(logits, (20000, 4)), top_k=2)
    frequency = np.bincount(np.asarray(draws), minlength=4) / 20000
    np.testing.assert_allclose(frequency, [0.625, 0.375, 0, 0], atol=0.015)


def test_nucleus_keeps_what_transformers_keeps_and_top_p_one_keeps_every_token():
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = 2.0 * jax.random.normal(jax.random.key(5), (4, 128_256))  # a Llama 3 vocabulary
    # the float32 running mass reaches 1.0 before the last tokens: at top_p = 1 they stay
    np.testing.assert_array_equal(F.sampling_distribution(logits, top_p=1.0), jax.nn.softmax(logits, axis=-1))
    for top_p in (0.1, 0.5, 0.9, 0.99):
        kept = np.asarray(F.sampling_distribution(logits[:, :1000], top_p=top_p)) > 0
        theirs = TopPLogitsWarper(top_p)(None, torch.from_numpy(np.array(logits[:, :1000])))
        np.testing.assert_array_equal(kept, np.isfinite(theirs.numpy()))
    # tied tokens: the smallest set reaching the mass (the lower ids first), not every token tied with its last
    np.testing.assert_allclose(F.sampling_distribution(jnp.array([2.0, 1, 1, 1, -5]), top_p=0.5),
                               [np.e / (np.e + 1), 1 / (np.e + 1), 0, 0, 0], rtol=1e-6)
    # the mass exactly reaches top_p (quarters are exact in float32): the set ends there, as transformers' does
    uniform = jnp.zeros(4)
    np.testing.assert_array_equal(F.sampling_distribution(uniform, top_p=0.5), [0.5, 0.5, 0, 0])
    assert np.isfinite(TopPLogitsWarper(0.5)(None, torch.zeros(1, 4)).numpy()).sum() == 2


def test_sampling_draws_along_the_vocabulary_axis_of_batch_by_time_logits():
    """[B, T, V] logits (a whole sequence's, as a model returns them): one token per position, from that row."""
    logits = jax.random.normal(jax.random.key(6), (2, 3, 5))
    draws = F.sample_logits(jax.random.key(7), logits, top_k=2)
    assert draws.shape == (2, 3)
    top_two = np.asarray(jax.lax.top_k(logits, 2)[1])  # each row's two most likely ids
    assert all(int(draws[b, t]) in top_two[b, t] for b in range(2) for t in range(3))
    np.testing.assert_array_equal(F.sample_logits(jax.random.key(7), logits, top_k=1), jnp.argmax(logits, axis=-1))
    greedy = F.sampling_distribution(logits, temperature=0.0)  # all mass on each row's argmax
    np.testing.assert_array_equal(greedy, jax.nn.one_hot(jnp.argmax(logits, axis=-1), 5))


def test_a_temperature_below_float32s_normal_range_is_greedy_not_nan():
    logits = jnp.array([[1.0, 2.0, 3.0], [30.0, 10.0, -4.0]])
    for temperature in (1e-30, 1e-44, 1e-300):
        np.testing.assert_array_equal(F.sampling_distribution(logits, temperature=temperature), [[0, 0, 1], [1, 0, 0]])
        assert F.sample_logits(jax.random.key(0), logits, temperature=temperature).tolist() == [2, 0]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("split", [False, True])
def test_a_half_precision_sinusoid_table_is_the_float64_table_rounded(dtype, split):
    # positions past 256 (bf16) or 2048 (fp16) are not representable in the table's dtype: the angles must not be
    positions, dim = 4096, 64
    omega = 10000.0 ** (-np.arange(0, dim, 2) / dim)
    angles = np.arange(positions)[:, None] * omega
    sines, cosines = np.sin(angles), np.cos(angles)
    reference = (np.concatenate([sines, cosines], axis=1) if split
                 else np.stack([sines, cosines], axis=-1).reshape(positions, dim))
    table = F.sinusoidal_positions(positions, dim, dtype=dtype, split=split)
    assert table.dtype == dtype
    # half an ulp at 1 in the table's dtype, plus float32's angle rounding at position 4095 (~2.5e-4)
    tolerance = float(jnp.finfo(dtype).eps) / 2 + 3e-4
    assert np.abs(np.asarray(table, np.float64) - reference).max() <= tolerance


@pytest.mark.parametrize("num_heads", [1, 3, 6, 8, 12, 20])
def test_alibi_slopes_are_bloom_s_for_every_head_count(num_heads):
    """For a head count that is not a power of two the slopes of the next power down are followed by every other
    slope of the power up (Press et al.'s reference); transformers' BLOOM builds them so (``build_alibi_tensor``:
    the bias at distance one is the slope)."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    bloom = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)[:, 0, 1].numpy()
    np.testing.assert_allclose(F.alibi_slopes(num_heads), bloom, rtol=1e-6)


@pytest.mark.parametrize("head_dim, base, llama3", [
    (128, 500_000.0, (8.0, 1.0, 4.0, 8192)),   # Llama 3.1's own: every wavelength band is met
    (64, 10_000.0, (32.0, 2.0, 16.0, 2048)),   # Llama 3.2's factor, another band split
    (48, 10_000.0, None),                      # plain RoPE
])
def test_rope_frequencies_are_what_transformers_initialises(head_dim, base, llama3):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope, init = {"rope_type": "default", "rope_theta": base}, LlamaRotaryEmbedding.compute_default_rope_parameters
    if llama3 is not None:
        factor, low, high, original = llama3
        rope = dict(rope_type="llama3", rope_theta=base, factor=factor, low_freq_factor=low, high_freq_factor=high,
                    original_max_position_embeddings=original)
        init = ROPE_INIT_FUNCTIONS["llama3"]
        wavelengths = 2 * np.pi / F.rope_frequencies(head_dim, base)
        kept, slowed = wavelengths < original / high, wavelengths > original / low
        assert kept.any() and slowed.any() and (~kept & ~slowed).any()  # the case meets all three bands
    config = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim, rope_parameters=rope,
                         max_position_embeddings=65_536)
    theirs, _ = init(config)
    ours = F.rope_frequencies(head_dim, base, llama3=llama3)
    assert ours.dtype == np.float32 and ours.shape == (head_dim // 2,)
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=3e-7)  # float32, ~2 ulp


def test_llama3_rope_scaling_needs_its_high_factor_above_its_low_one():
    for high in (1.0, 0.5):
        with pytest.raises(ValueError, match=f"high_freq_factor > low_freq_factor, got {high} <= 1.0"):
            F.rope_frequencies(64, llama3=(8.0, 1.0, high, 8192))


def test_mean_pool_and_l2_normalize_are_sentence_transformers_and_torch_s():
    """sentence-transformers' mean pooling: the attention-mask-weighted mean, its count clamped at 1e-9 (a length
    of 0 gives zeros); ``torch.nn.functional.normalize``: each row over max(norm, eps)."""
    x_BTE = jax.random.normal(jax.random.key(4), (4, 5, 6))
    lengths_B = np.array([5, 3, 1, 0])
    mask_BT1 = torch.from_numpy((np.arange(5)[None, :] < lengths_B[:, None]).astype(np.float32))[..., None]
    x_torch = torch.from_numpy(np.array(x_BTE))
    theirs = (x_torch * mask_BT1).sum(1) / torch.clamp(mask_BT1.sum(1), min=1e-9)
    np.testing.assert_allclose(F.mean_pool(x_BTE, jnp.asarray(lengths_B)), theirs.numpy(), atol=1e-6)
    np.testing.assert_allclose(F.mean_pool(x_BTE), x_torch.mean(1).numpy(), atol=1e-6)
    rows_BE = jnp.asarray(np.concatenate([np.asarray(x_BTE[:, 0]), np.zeros((1, 6)), np.full((1, 6), 1e-14)]),
                          jnp.float32)
    for eps, ours in ((1e-12, F.l2_normalize(rows_BE)), (1e-3, F.l2_normalize(rows_BE, eps=1e-3))):  # torch's default
        expected = torch.nn.functional.normalize(torch.from_numpy(np.array(rows_BE)), dim=-1, eps=eps).numpy()
        np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(F.l2_normalize(x_BTE), torch.nn.functional.normalize(x_torch, dim=-1).numpy(),
                               rtol=1e-6, atol=1e-7)  # rows along the last axis, whatever leads


def test_masks_are_transformers_mask_functions():
    """Causal and sliding-window masks against `transformers.masking_utils` (its window keeps ``kv > q − W``: the
    query and the W − 1 keys before it), queries offset as a cache's; padding as a literal table."""
    from transformers import masking_utils as hf

    q_T1, kv_1S = torch.arange(4)[:, None], torch.arange(7)[None, :]

    def theirs(mask_function, offset):
        return hf.add_offsets_to_mask_function(mask_function, offset, 0)(0, 0, q_T1, kv_1S).numpy()

    for offset in (0, 3):
        at = {} if offset == 0 else {"offset": offset}  # offset 0 by default
        np.testing.assert_array_equal(F.causal_mask(4, 7, **at), theirs(hf.causal_mask_function, offset))
        np.testing.assert_array_equal(F.attention_mask(4, 7, causal=True, **at)[0, 0],
                                      theirs(hf.causal_mask_function, offset))
        for window in (1, 2, 5):
            expected = theirs(hf.sliding_window_causal_mask_function(window), offset)
            np.testing.assert_array_equal(F.sliding_window_mask(4, 7, window, **at), expected)
            np.testing.assert_array_equal(F.attention_mask(4, 7, window=window, **at)[0, 0], expected)
    assert F.attention_mask(4, 7) is None
    padding = F.padding_mask(jnp.array([3, 0, 1]), 3)
    np.testing.assert_array_equal(padding[:, 0, 0], [[True, True, True], [False, False, False], [True, False, False]])
    np.testing.assert_array_equal(F.attention_mask(3, 3, key_lengths=jnp.array([3, 0, 1])), padding)
    np.testing.assert_array_equal(F.attention_mask(3, 3, causal=True, key_lengths=jnp.array([3, 0, 1])),
                                  padding & F.causal_mask(3)[None, None])
