"""Blockwise and XLA attention against the plain path: outputs and gradients, masks, memory shape."""

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer.functional as F

TOL = 1e-5  # fp32; the online softmax only re-associates sums
IMPLS = ("naive", "blockwise", "xla")


def _inputs(B, T, S, H, K, D=8, seed=0):
    key_q, key_k, key_v, key_g = jax.random.split(jax.random.key(seed), 4)
    q_BTHD = jax.random.normal(key_q, (B, T, H, D))
    k_BSKD = jax.random.normal(key_k, (B, S, K, D))
    v_BSKD = jax.random.normal(key_v, (B, S, K, D))
    cotangent_BTHD = jax.random.normal(key_g, (B, T, H, D))
    return q_BTHD, k_BSKD, v_BSKD, cotangent_BTHD


def _outputs_and_grads(shape, **kwargs):
    """``{impl: (out, (dq, dk, dv))}``, all three paths in one compile."""
    q, k, v, cotangent = _inputs(*shape)

    @jax.jit
    def all_paths(q, k, v):
        results = {}
        for impl in IMPLS:
            def loss(q, k, v, impl=impl):
                out = F.attention(q, k, v, impl=impl, block_size=4, **kwargs)
                return jnp.sum(out * cotangent), out
            grads, out = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
            results[impl] = (out, grads)
        return results

    return all_paths(q, k, v)


def _assert_paths_agree(results):
    out_ref, grads_ref = results["naive"]
    assert np.all(np.isfinite(np.asarray(out_ref)))
    for impl in ("blockwise", "xla"):
        out, grads = results[impl]
        np.testing.assert_allclose(out, out_ref, atol=TOL, rtol=0, err_msg=f"{impl} output")
        for name, grad, grad_ref in zip("qkv", grads, grads_ref):
            np.testing.assert_allclose(grad, grad_ref, atol=TOL, rtol=0, err_msg=f"{impl} d{name}")


RELATIVE = jax.random.normal(jax.random.key(7), (8, 4))  # T5's relative bias table: 8 buckets, 4 heads

# (B, T, S, H, K) and the structured arguments; block_size is 4, so S = 11, 13, 14 leave a ragged tile
CASES = {
    "causal_mha_alibi": ((2, 12, 12, 4, 4), dict(causal=True, alibi_slopes=F.alibi_slopes(4))),
    "causal_gqa_padding": ((2, 12, 12, 4, 2), dict(causal=True, key_lengths=jnp.array([12, 7]))),
    "mqa_bidirectional_padding_alibi": ((2, 9, 9, 2, 1), dict(alibi_slopes=F.alibi_slopes(2), key_lengths=jnp.array([9, 4]))),
    "sliding_window_ragged": ((1, 13, 13, 4, 2), dict(window=3)),
    "cross_attention_ragged": ((2, 5, 11, 4, 1), dict(key_lengths=jnp.array([11, 6]))),
    "decode_offset_alibi": ((2, 3, 14, 4, 2), dict(causal=True, q_offset=11, alibi_slopes=F.alibi_slopes(4))),
    # T5: a [buckets, heads] bias table, unscaled scores; distances past 6 share the log buckets' last one
    "bidirectional_padding_relative": ((2, 9, 11, 4, 2), dict(key_lengths=jnp.array([11, 5]), relative_bias=RELATIVE,
                                                              relative_max_distance=6, scale=1.0)),
    "causal_relative": ((2, 12, 12, 4, 4), dict(causal=True, relative_bias=RELATIVE, relative_bidirectional=False,
                                                relative_max_distance=6)),
    "decode_offset_relative": ((2, 3, 14, 4, 2), dict(causal=True, q_offset=11, relative_bias=RELATIVE,
                                                      relative_bidirectional=False, relative_max_distance=6)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_blockwise_and_xla_match_naive(case):
    shape, kwargs = CASES[case]
    _assert_paths_agree(_outputs_and_grads(shape, **kwargs))


@pytest.mark.parametrize("case", ["causal_mha_alibi", "causal_gqa_padding", "sliding_window_ragged", "causal_relative"])
def test_causal_query_blocks_match_the_whole_causal_pass(case):
    """Every path in blocks of 3 queries (T = 12 or 13: even, or a 1-query remainder) against naive in one block."""
    shape, kwargs = CASES[case]
    q, k, v, cotangent = _inputs(*shape)

    def out_and_grads(impl, query_block_size):
        def loss(q, k, v):
            out = F.attention(q, k, v, impl=impl, block_size=4, query_block_size=query_block_size, **kwargs)
            return jnp.sum(out * cotangent), out
        return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)

    grads_ref, out_ref = jax.jit(lambda: out_and_grads("naive", None))()
    for impl in IMPLS:
        grads, out = jax.jit(lambda impl=impl: out_and_grads(impl, 3))()
        np.testing.assert_allclose(out, out_ref, atol=TOL, rtol=0, err_msg=f"{impl} output")
        for name, grad, grad_ref in zip("qkv", grads, grads_ref):
            np.testing.assert_allclose(grad, grad_ref, atol=TOL, rtol=0, err_msg=f"{impl} d{name}")


def test_query_blocks_skip_the_masked_tiles():
    """4 blocks of 32 queries in a 128-query causal pass (B = 1, H = 2, D = 8): score products of 32 queries
    against 32, 64, 96, 128 keys (10/16 of the square), and 4 value products of 32 × 8."""
    q, k, v, _ = _inputs(1, 128, 128, 2, 2)
    jaxpr = jax.make_jaxpr(lambda q, k, v: F.attention(q, k, v, causal=True, query_block_size=32))(q, k, v)
    sizes = [int(np.prod(eqn.outvars[0].aval.shape)) for eqn in jaxpr.eqns if eqn.primitive.name == "dot_general"]
    assert sorted(sizes) == sorted([2 * 32 * 8] * 4 + [2 * 32 * keys for keys in (32, 64, 96, 128)])


def test_fully_masked_rows_are_zero_with_finite_gradients():
    """Sequence 0 has no keys at all; sequence 1 decodes at positions 6..9 in a window of 5."""
    results = _outputs_and_grads((2, 4, 10, 2, 1), window=5, q_offset=6, key_lengths=jnp.array([0, 10]))
    _assert_paths_agree(results)
    for impl in IMPLS:
        out, (d_q, d_k, d_v) = results[impl]
        np.testing.assert_array_equal(out[0], 0.0, err_msg=impl)
        assert np.abs(np.asarray(out[1])).min() > 0.0, impl
        for grad in (d_q, d_k, d_v):
            assert np.all(np.isfinite(np.asarray(grad))), impl
            np.testing.assert_array_equal(grad[0], 0.0, err_msg=impl)


def test_decoding_with_offset_equals_slice_of_full_causal_pass():
    """Queries 9..11 against all 12 keys at a traced q_offset=9 are rows 9..11 of the full causal pass."""
    q, k, v, _ = _inputs(1, 12, 12, 4, 2)
    slopes = F.alibi_slopes(4)

    @jax.jit
    def full_and_decode(q, offset):
        run = lambda q, offset, impl: F.attention(
            q, k, v, impl=impl, causal=True, q_offset=offset, alibi_slopes=slopes, block_size=5)
        return {impl: (run(q, 0, impl)[:, 9:], run(q[:, 9:], offset, impl)) for impl in IMPLS}

    for impl, (full, decode) in full_and_decode(q, 9).items():
        np.testing.assert_allclose(decode, full, atol=TOL, rtol=0, err_msg=impl)


def test_blockwise_matches_torch_sdpa_with_gqa_padding_and_alibi():
    torch = pytest.importorskip("torch")
    B, T, H, K, D = 2, 10, 4, 2, 8
    q, k, v, _ = _inputs(B, T, T, H, K, D)
    lengths, slopes = np.array([10, 6]), np.asarray(F.alibi_slopes(H))
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed_BTS = (j <= i)[None] & (j < lengths[:, None, None])[:, :1]
    bias_BHTS = np.where(allowed_BTS[:, None], -slopes[:, None, None] * np.abs(i - j), -np.inf)
    to_torch = lambda x: torch.from_numpy(np.array(x)).transpose(1, 2)  # [B, T, H, D] -> [B, H, T, D]
    expected = torch.nn.functional.scaled_dot_product_attention(
        to_torch(q), to_torch(k), to_torch(v), attn_mask=torch.from_numpy(bias_BHTS.astype(np.float32)), enable_gqa=True
    ).transpose(1, 2).numpy()
    blockwise = jax.jit(lambda q, k, v: F.blockwise_attention(
        q, k, v, causal=True, key_lengths=jnp.asarray(lengths), alibi_slopes=slopes, block_size=3))
    out = blockwise(q, k, v)
    np.testing.assert_allclose(out, expected, atol=TOL, rtol=0)


def test_alibi_slope_gradient_matches_naive():
    q, k, v, cotangent = _inputs(1, 7, 7, 2, 1)

    @jax.jit
    def slope_grads(slopes):
        loss = lambda s, impl: jnp.sum(F.attention(q, k, v, impl=impl, causal=True, alibi_slopes=s, block_size=3) * cotangent)
        return [jax.grad(loss)(slopes, impl) for impl in ("naive", "blockwise")]

    d_slopes_naive, d_slopes_blockwise = slope_grads(jnp.array([0.5, 0.25]))
    np.testing.assert_allclose(d_slopes_blockwise, d_slopes_naive, atol=TOL, rtol=0)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_bias_table_gradient_matches_naive(bidirectional):
    q, k, v, cotangent = _inputs(2, 9, 9, 4, 2)

    @jax.jit
    def table_grads(table):
        def loss(t, impl):
            out = F.attention(q, k, v, impl=impl, causal=not bidirectional, key_lengths=jnp.array([9, 6]),
                              relative_bias=t, relative_bidirectional=bidirectional, relative_max_distance=6,
                              block_size=4, query_block_size=4)
            return jnp.sum(out * cotangent)
        return [jax.grad(loss)(table, impl) for impl in IMPLS]

    d_naive, *others = table_grads(RELATIVE)
    distances = np.arange(9)[:, None] - np.arange(9)[None, :]
    reached = np.unique(F.relative_position_buckets(distances, num_buckets=8, max_distance=6,
                                                    bidirectional=bidirectional))
    assert np.array_equal(np.nonzero(np.abs(d_naive).sum(axis=1))[0], reached)  # exactly the buckets used
    for d_table in others:
        np.testing.assert_allclose(d_table, d_naive, atol=TOL, rtol=0)


def _arrays_in(jaxpr):
    """Shapes of every intermediate in a jaxpr, nested scan/custom_vjp/pjit bodies included."""
    for eqn in jaxpr.eqns:
        yield from (var.aval.shape for var in eqn.outvars)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, jex.ClosedJaxpr):
                    yield from _arrays_in(sub.jaxpr)
                elif isinstance(sub, jex.Jaxpr):
                    yield from _arrays_in(sub)


def _primitives_in(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn.primitive.name
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, jex.ClosedJaxpr):
                    yield from _primitives_in(sub.jaxpr)


def test_blockwise_never_builds_the_score_matrix_forward_or_backward():
    n, block, H = 1024, 128, 2
    q, k, v = (jax.ShapeDtypeStruct((1, n, H, 16), jnp.float32) for _ in range(3))

    def traced(impl, with_grad):
        fn = lambda q, k, v: jnp.sum(F.attention(q, k, v, impl=impl, causal=True, block_size=block))
        return jax.make_jaxpr(jax.grad(fn, argnums=(0, 1, 2)) if with_grad else fn)(q, k, v).jaxpr

    def square_arrays(jaxpr):
        """Arrays with two length-n axes or at least a quarter of the scores' H·n² elements."""
        return [s for s in _arrays_in(jaxpr) if list(s).count(n) >= 2 or np.prod(s) >= H * n * n // 4]

    assert square_arrays(traced("naive", with_grad=False))  # the check can see a score matrix
    assert square_arrays(traced("naive", with_grad=True))
    assert square_arrays(traced("blockwise", with_grad=False)) == []
    assert square_arrays(traced("blockwise", with_grad=True)) == []
    assert any(name.startswith("custom_vjp_call") for name in _primitives_in(traced("blockwise", with_grad=False)))


def test_bad_input_is_one_line_value_error():
    q, k, v, _ = _inputs(2, 4, 4, 2, 1)
    with pytest.raises(ValueError, match="attention_impl .* got 'flash'"):
        F.attention(q, k, v, impl="flash")
    with pytest.raises(ValueError, match=r"key_lengths must have shape \[batch\] = \(2,\)"):
        F.attention(q, k, v, impl="blockwise", key_lengths=jnp.array([4]))
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        F.attention(q, k, v, impl="xla", alibi_slopes=jnp.ones(3))
    with pytest.raises(ValueError, match=r"relative_bias must have shape \[buckets, heads\] = \(P, 2\)"):
        F.attention(q, k, v, impl="blockwise", relative_bias=jnp.ones((8, 3)))
    with pytest.raises(ValueError, match="block_size must be positive, got 0"):
        F.blockwise_attention(q, k, v, block_size=0)


def test_called_with_its_defaults_blockwise_attention_is_the_plain_path_with_its_defaults():
    """A user's own call with no keyword: non-causal, T5's bidirectional buckets up to distance 128, as `attention`.
    Over 20 positions of 8 buckets, distance 16 lies on a log-bucket boundary that moves with the maximum distance."""
    q, k, v, _ = _inputs(2, 20, 20, 4, 2)
    distances = np.arange(20)[:, None] - np.arange(20)[None, :]
    assert not np.array_equal(*(F.relative_position_buckets(distances, num_buckets=8, max_distance=far,
                                                            bidirectional=True) for far in (128, 129)))
    np.testing.assert_allclose(F.blockwise_attention(q, k, v, block_size=8), F.attention(q, k, v), atol=TOL, rtol=0)
    np.testing.assert_allclose(F.blockwise_attention(q, k, v, relative_bias=RELATIVE, block_size=8),
                               F.attention(q, k, v, relative_bias=RELATIVE), atol=TOL, rtol=0)
