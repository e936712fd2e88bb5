"""The seed chapters' worked numbers, reproduced through jaxformer.functional."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer.functional as F
from jaxformer.functional.dot_product import attention_logits
from seed_kedi import B_1, W_1, W_2, W_O, X, two_heads

KEDI, SUTU, ICTI = 0, 1, 2


@pytest.fixture(scope="module")
def heads():
    q, k, v = two_heads()
    out, weights = F.dot_product_attention(q, k, v, return_weights=True)
    return np.asarray(out), np.asarray(weights)


def test_kedi_head_one_weights_and_output(heads):
    out, weights = heads
    np.testing.assert_allclose(weights[0, ICTI], [0.4230, 0.5012, 0.0759], atol=5e-5)
    np.testing.assert_allclose(weights[0], [[0.6961, 0.1791, 0.1249], [0.1750, 0.6804, 0.1446], [0.4230, 0.5012, 0.0759]],
                               atol=5e-5)
    np.testing.assert_allclose(out[:, 0], [[0.7444, 0.3433], [0.3256, 0.7443], [0.5308, 0.6009]], atol=5e-5)


def test_kedi_scaled_scores_before_softmax():
    q, k, _ = two_heads()
    scores = np.asarray(attention_logits(q[None], k[None]))[0, 0]
    np.testing.assert_allclose(scores[ICTI], [1.9304, 2.1001, 0.2121], atol=5e-5)


def test_kedi_head_two_and_output_projection(heads):
    out, weights = heads
    np.testing.assert_allclose(weights[1, KEDI], [0.0383, 0.0383, 0.9234], atol=5e-5)
    np.testing.assert_allclose(weights[1, ICTI], [0.4675, 0.4675, 0.0650], atol=5e-5)
    np.testing.assert_allclose(out[:, 1], [[0.8310, 0.1014], [0.8310, 0.1014], [0.0585, 0.5649]], atol=5e-5)
    projected = out.reshape(3, 4) @ W_O
    np.testing.assert_allclose(
        projected, [[0.7646, 0.3635, 0.8310, 0.0], [0.3458, 0.7646, 0.8310, 0.0], [0.6438, 0.7139, 0.0585, 0.0]], atol=5e-5
    )


def test_kedi_block_layer_norm_and_relu_detectors(heads):
    out, _ = heads
    residual = X + out.reshape(3, 4) @ W_O
    normed = np.asarray(F.layer_norm(jnp.asarray(residual)))
    np.testing.assert_allclose(normed[KEDI], [1.6543, -0.8299, -0.0699, -0.7545], atol=2e-4)
    np.testing.assert_allclose(normed[ICTI], [-0.4932, 0.4908, 1.3268, -1.3244], atol=2e-4)
    identity = np.eye(8, dtype=np.float32)  # read the detectors' activations directly
    detectors = np.asarray(F.feed_forward(jnp.asarray(normed), W_1, identity, activation="relu", b_in_F=B_1))
    np.testing.assert_allclose(detectors[KEDI], [0.6845, 0, 0, 1.1543, 0, 0, 0, 0], atol=2e-4)
    np.testing.assert_allclose(detectors[ICTI], [0, 0.9176, 0, 0, 0, 0.8268, 0, 0], atol=2e-4)
    block_out = residual + np.asarray(F.feed_forward(jnp.asarray(normed), W_1, W_2, activation="relu", b_in_F=B_1))
    np.testing.assert_allclose(block_out, [[2.2847, 0.4635, 1.1733, 0.5], [0.4458, 2.2860, 1.1763, 0.5],
                                           [0.6438, 1.1810, 1.6654, 0.5]], atol=2e-4)


def test_article12_three_tokens_unscaled_and_causal():
    x = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)  # tokens as rows
    omega_q = np.array([[1, 0], [1, 2]], dtype=np.float32)
    omega_k = np.array([[1, 1], [0, 1]], dtype=np.float32)
    q, k, v = (x @ omega_q.T)[:, None], (x @ omega_k.T)[:, None], x[:, None]
    out, weights = F.dot_product_attention(q, k, v, scale=1.0, return_weights=True)
    np.testing.assert_allclose(weights[0], [[0.090, 0.245, 0.665], [0.063, 0.468, 0.468], [0.013, 0.265, 0.721]],
                               atol=1e-3)
    np.testing.assert_allclose(out[:, 0], [[0.755, 0.910], [0.532, 0.937], [0.735, 0.987]], atol=1e-3)
    _, causal = F.dot_product_attention(q, k, v, scale=1.0, mask=F.causal_mask(3), return_weights=True)
    np.testing.assert_allclose(causal[0], [[1, 0, 0], [0.119, 0.881, 0], [0.013, 0.265, 0.721]], atol=1e-3)
    _, scaled = F.dot_product_attention(q, k, v, return_weights=True)  # default 1/sqrt(2)
    np.testing.assert_allclose(scaled[0, 1], [0.108, 0.446, 0.446], atol=1e-3)


@pytest.mark.parametrize(
    ("d_k", "scaled_weight", "unscaled_weight"), [(2, 0.104, 0.165), (8, 0.105, 0.420), (64, 0.108, 0.786), (512, 0.107, 0.928)]
)
def test_sqrt_dk_keeps_the_winning_weight_flat(d_k, scaled_weight, unscaled_weight):
    """Seed table: average weight of the winning key among 64 random keys, with and without 1/sqrt(d_k)."""
    draws = 400
    key_q, key_k = jax.random.split(jax.random.key(d_k))
    q = jax.random.normal(key_q, (draws, 1, 1, d_k))
    k = jax.random.normal(key_k, (draws, 64, 1, d_k))
    _, w_scaled = F.dot_product_attention(q, k, k, return_weights=True)
    _, w_raw = F.dot_product_attention(q, k, k, scale=1.0, return_weights=True)
    assert float(w_scaled.max(-1).mean()) == pytest.approx(scaled_weight, abs=0.03)
    assert float(w_raw.max(-1).mean()) == pytest.approx(unscaled_weight, abs=0.04)
    score_std = float(jnp.std(jnp.einsum("nd,nd->n", q[:, 0, 0], k[:, 0, 0])))
    assert score_std == pytest.approx(np.sqrt(d_k), rel=0.12)


def test_unmasked_attention_is_permutation_equivariant_and_causal_breaks_it():
    q, k, v = two_heads()
    order = [ICTI, KEDI, SUTU]
    undo = np.argsort(order)
    base = np.asarray(F.dot_product_attention(q, k, v))
    shuffled = np.asarray(F.dot_product_attention(q[order], k[order], v[order]))[undo]
    assert np.abs(base - shuffled).max() < 1e-6
    causal = F.causal_mask(3)
    base_c = np.asarray(F.dot_product_attention(q, k, v, mask=causal))
    shuffled_c = np.asarray(F.dot_product_attention(q[order], k[order], v[order], mask=causal))[undo]
    assert np.abs(base_c - shuffled_c).max() > 0.1


def test_added_sinusoids_break_the_symmetry_by_the_seed_amount():
    pe = np.asarray(F.sinusoidal_positions(3, 4))
    np.testing.assert_allclose(pe[1], [0.8415, 0.5403, 0.0100, 1.0000], atol=1e-4)
    order = [ICTI, KEDI, SUTU]
    base = np.asarray(F.dot_product_attention(*two_heads(X + 0.3 * pe)))[:, 0]
    shuffled = np.asarray(F.dot_product_attention(*two_heads(X[order] + 0.3 * pe)))[:, 0][np.argsort(order)]
    np.testing.assert_allclose(base, [[0.8029, 0.7345], [0.6385, 1.0023], [0.7865, 0.8342]], atol=1e-4)
    np.testing.assert_allclose(shuffled, [[1.1319, 0.5094], [0.7489, 0.6805], [0.8767, 0.6607]], atol=1e-4)
    assert np.abs(base - shuffled).max() == pytest.approx(0.3289, abs=1e-4)


def test_sinusoidal_dot_products_depend_only_on_the_offset():
    with jax.enable_x64(True):
        pe = np.asarray(F.sinusoidal_positions(256 + 64, 64, dtype=jnp.float64))
    expected = {0: 32.0, 1: 30.916832, 2: 28.303862, 4: 23.934362, 8: 22.413912, 16: 19.372820, 32: 19.553972,
                64: 13.906089}
    for offset, mean in expected.items():
        dots = np.einsum("pd,pd->p", pe[:256], pe[offset:256 + offset])
        assert dots.mean() == pytest.approx(mean, abs=1e-6)
        assert dots.std() < 1e-12
    np.testing.assert_allclose(np.linalg.norm(pe, axis=1), np.sqrt(32), atol=1e-10)


def test_rope_scores_depend_only_on_the_offset_while_added_sinusoids_do_not():
    with jax.enable_x64(True):
        key_q, key_k, key_w = jax.random.split(jax.random.key(7), 3)
        q = jax.random.normal(key_q, (64,), dtype=jnp.float64)
        k = jax.random.normal(key_k, (64,), dtype=jnp.float64)

        def rope_score(m, n):
            q_m = F.apply_rope(q[None, None, :], jnp.array([m], dtype=jnp.float64))
            k_n = F.apply_rope(k[None, None, :], jnp.array([n], dtype=jnp.float64))
            return float(jnp.sum(q_m * k_n))

        pe = F.sinusoidal_positions(5300, 64, dtype=jnp.float64)
        w_q, w_k = jax.random.normal(key_w, (2, 64, 64), dtype=jnp.float64) / 8.0

        def additive_score(m, n):
            return float(((q + pe[m]) @ w_q) @ ((k + pe[n]) @ w_k))

        for offset in (0, 1, 5, 50, 200):
            starts = (0, 100, 1000, 5000)
            rope = [rope_score(n + offset, n) for n in starts]
            additive = [additive_score(n + offset, n) for n in starts]
            assert max(rope) - min(rope) < 1e-11
            assert max(additive) - min(additive) > 0.1


def test_rope_rotates_each_consecutive_pair_by_the_chapters_angle():
    """Section 7.4's rotation: pair (2i, 2i+1) at position m turned by m·θ_i, θ_i = 10000^(-2i/d_k); ``scale``
    multiplies m (position interpolation), ``base`` replaces 10000."""
    with jax.enable_x64(True):
        x = np.asarray(jax.random.normal(jax.random.key(3), (5, 2, 8), dtype=jnp.float64))
        positions = np.array([0, 1, 7, 100, 4096])

        def chapter(scale=1.0, base=10000.0):
            theta = base ** (-np.arange(0, 8, 2) / 8)
            angle = scale * positions[:, None, None] * theta  # [T, 1, J]
            even, odd = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = np.cos(angle) * even - np.sin(angle) * odd
            out[..., 1::2] = np.sin(angle) * even + np.cos(angle) * odd
            return out

        np.testing.assert_allclose(F.apply_rope(jnp.asarray(x), jnp.asarray(positions)), chapter(), atol=1e-12)
        np.testing.assert_allclose(F.apply_rope(jnp.asarray(x), jnp.asarray(positions), scale=0.25), chapter(0.25),
                                   atol=1e-12)
        np.testing.assert_allclose(F.apply_rope(jnp.asarray(x), jnp.asarray(positions), base=500.0),
                                   chapter(base=500.0), atol=1e-12)
        np.testing.assert_allclose(F.apply_rope(jnp.asarray(x), jnp.asarray(positions),
                                                frequencies=F.rope_frequencies(8)), chapter(), atol=1e-5)


def test_alibi_slopes_and_the_seed_bias_table():
    np.testing.assert_allclose(F.alibi_slopes(8), [1 / 2 ** i for i in range(1, 9)], rtol=1e-6)
    bias = np.asarray(F.alibi_bias(8, 6, 6))[0]
    table = np.where(np.asarray(F.causal_mask(6)), bias, -np.inf)
    np.testing.assert_allclose(table[5], [-2.5, -2.0, -1.5, -1.0, -0.5, 0.0])
    assert np.isneginf(table[2, 3:]).all() and table[2, 0] == -1.0
    # a tile of keys starting at j0 = 2 for queries at 4 and 5: offset 4 - j0; without one, queries start at 0
    np.testing.assert_array_equal(F.alibi_bias_from_slopes(F.alibi_slopes(8), 2, 3, offset=2),
                                  np.asarray(F.alibi_bias(8, 6, 6))[:, 4:, 2:5])
    np.testing.assert_array_equal(F.alibi_bias_from_slopes(F.alibi_slopes(8), 6, 6), F.alibi_bias(8, 6, 6))


def test_temperature_sharpens_but_never_reorders():
    probs_t1 = F.sampling_distribution(jnp.array([2.0, 0.0]), temperature=1.0)
    probs_t05 = F.sampling_distribution(jnp.array([2.0, 0.0]), temperature=0.5)
    assert float(probs_t1[0]) == pytest.approx(0.881, abs=5e-4)
    assert float(probs_t05[0]) == pytest.approx(0.982, abs=5e-4)
