"""The three families: who sees what, padding, position limits, and jit forward + backward."""

from __future__ import annotations

import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_helpers import jit_forward, tiny, tokens

from jaxformer.architecture import Family
from jaxformer.models import apply, build_model, init_params
from jaxformer.models.build import FAMILIES


def perturbed(tokens_BT, position):
    return tokens_BT.at[:, position].set((tokens_BT[:, position] + 1) % 32)


def changed_positions(before, after):
    return [bool(changed) for changed in np.abs(np.asarray(after - before)).max(axis=(0, 2)) > 1e-6]


def test_every_family_has_a_module():
    assert list(FAMILIES) == list(typing.get_args(Family))


def test_a_decoder_position_does_not_see_later_tokens():
    model = jit_forward(build_model(tiny(position="rope", num_kv_heads=1), rngs=nnx.Rngs(0)))
    x = tokens(2, 8)
    before, _ = model(x)
    after, _ = model(perturbed(x, 5))
    assert changed_positions(before, after) == [False] * 5 + [True] * 3


def test_an_encoder_position_sees_later_tokens():
    model = jit_forward(build_model(tiny(family="encoder", norm_position="post"), rngs=nnx.Rngs(0)))
    x = tokens(2, 8)
    before, _ = model(x)
    after, _ = model(perturbed(x, 5))
    assert all(changed_positions(before, after))


def test_encoder_decoder_target_is_causal_and_sees_the_whole_source():
    model = jit_forward(build_model(tiny(family="encoder_decoder", position="sinusoidal"), rngs=nnx.Rngs(0)))
    source, target = tokens(2, 7, seed=1), tokens(2, 5, seed=2)
    before, _ = model(source, target)
    after_target, _ = model(source, perturbed(target, 3))
    after_source, _ = model(perturbed(source, 6), target)
    assert changed_positions(before, after_target) == [False] * 3 + [True] * 2
    assert all(changed_positions(before, after_source))


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_padding_hides_the_padded_keys(family):
    model = build_model(tiny(family=family, position="alibi"), rngs=nnx.Rngs(0))
    x = tokens(1, 6)
    alone, _ = model(x[:, :4])  # eager: two shapes, one run each
    padded, _ = model(x, lengths=jnp.array([4]))
    np.testing.assert_allclose(padded[:, :4], alone, atol=1e-5)


def test_learned_positions_past_the_table_raise():
    model = build_model(tiny(position="learned"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"length 17 is past the learned position table \(model.max_seq_len=16\)"):
        model(tokens(1, 17))


def test_a_numpy_integer_offset_is_checked_against_the_table_as_a_python_one():
    embedding = build_model(tiny(position="learned"), rngs=nnx.Rngs(0)).embedding
    ids = tokens(1, 8)
    with pytest.raises(ValueError, match=r"length 18 is past the learned position table \(model.max_seq_len=16\)"):
        embedding(ids, offset=np.int64(10))
    expected = np.asarray(embedding.tokens[...])[np.asarray(ids)] + np.asarray(embedding.positions[...])[3:11]
    np.testing.assert_allclose(embedding(ids, offset=np.int64(3)), expected, atol=1e-7)


def test_appending_a_token_leaves_earlier_outputs_unchanged():
    model = build_model(tiny(position="learned", norm_position="sandwich", sliding_window=3), rngs=nnx.Rngs(0))  # eager
    x = tokens(2, 9)
    shorter, _ = model(x[:, :8])
    longer, _ = model(x)
    np.testing.assert_allclose(longer[:, :8], shorter, atol=1e-5)


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_each_family_runs_forward_and_backward_under_jit(family):
    cfg = tiny(family=family, num_experts=4, experts_per_token=2, num_shared_experts=1, activation="swiglu")
    graphdef, params = init_params(cfg, seed=0)
    x = tokens(2, 6)
    inputs = (x, x) if family == "encoder_decoder" else (x,)

    @jax.jit
    def loss_and_grad(params):
        def loss(params):
            logits, aux_loss = apply(graphdef, params, *inputs)
            targets = jnp.roll(x, -1, axis=1)
            nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)
            return jnp.mean(nll) + cfg.router_aux_loss_weight * aux_loss, (logits, aux_loss)  # as training weights it

        return jax.value_and_grad(loss, has_aux=True)(params)

    (loss, (logits, aux_loss)), grads = loss_and_grad(params)
    assert logits.shape == (2, 6, 32) and logits.dtype == jnp.float32
    assert np.isfinite(float(loss)) and float(aux_loss) > 0  # MoE layers report their balancing loss
    leaves = jax.tree.leaves(grads)
    assert len(leaves) == len(jax.tree.leaves(params))
    assert all(np.isfinite(np.asarray(g)).all() for g in leaves)
    assert np.mean([float(jnp.abs(g).max()) > 0 for g in leaves]) > 0.9  # gradient reaches (nearly) every parameter
