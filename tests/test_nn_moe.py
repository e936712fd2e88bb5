"""Mixture of experts: top-k routing, renormalised gates, capacity dispatch, balancing loss, shared experts."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_helpers import tiny, tokens

import jaxformer.functional as F
from jaxformer.functional import moe as M
from jaxformer.models import apply, build_model
from jaxformer.nn import MoE

N, E, X, R = 12, 8, 4, 2


def inputs(seed=0):
    key_x, key_r, key_e = jax.random.split(jax.random.key(seed), 3)
    x_NE = jax.random.normal(key_x, (N, E))
    router_EX = jax.random.normal(key_r, (E, X))
    keys = jax.random.split(key_e, 2)
    experts = {"w_in_XEF": 0.3 * jax.random.normal(keys[0], (X, E, 16)),
               "w_out_XFE": 0.3 * jax.random.normal(keys[1], (X, 16, E))}
    return x_NE, router_EX, experts


def test_routing_picks_the_top_k_and_gates_sum_to_one():
    x_NE, router_EX, _ = inputs()
    routing = M.route(x_NE, router_EX, R)
    probs = np.asarray(routing.probs)
    expected = np.argsort(-probs, axis=-1)[:, :R]
    np.testing.assert_array_equal(routing.experts, expected)
    np.testing.assert_allclose(routing.gates.sum(-1), 1.0, rtol=1e-6)
    chosen = np.take_along_axis(probs, expected, axis=-1)
    np.testing.assert_allclose(routing.gates, chosen / chosen.sum(-1, keepdims=True), rtol=1e-6)
    for k in (0, X + 1):  # the bound is the router's expert count (X = 4), not the model width (E = 8)
        with pytest.raises(ValueError, match=rf"experts per token must be in \[1, 4\], got {k}"):
            M.route(x_NE, router_EX, k)


def test_one_expert_per_token_is_gated_by_its_router_probability_so_the_router_learns_from_the_output():
    """Switch Transformer's top-1: y = p_x(x) · FFN_x(x). Renormalised over one expert the gate was 1 whatever the
    router said, and the router's gradient from the output was rounding noise (it learnt from the balancing loss
    alone)."""
    x_NE, router_EX, experts = inputs()

    def switch(router):  # each token alone, its best expert weighted by that expert's router probability
        probs_NX = jax.nn.softmax(x_NE @ router, axis=-1)
        best = jnp.argmax(probs_NX, axis=-1)
        return jnp.stack([probs_NX[t, best[t]] * F.feed_forward(x_NE[t], experts["w_in_XEF"][best[t]],
                                                               experts["w_out_XFE"][best[t]], activation="gelu")
                          for t in range(N)])

    def ours(router):
        return M.moe_feed_forward(x_NE, router, experts, k=1, activation="gelu")[0]

    routing = M.route(x_NE, router_EX, 1)
    np.testing.assert_allclose(routing.gates[:, 0], np.max(np.asarray(routing.probs), axis=-1), rtol=1e-6)
    np.testing.assert_allclose(ours(router_EX), switch(router_EX), atol=1e-5)
    grad_ours, grad_switch = (jax.grad(lambda r, f=f: jnp.sum(f(r) ** 2))(router_EX) for f in (ours, switch))
    np.testing.assert_allclose(grad_ours, grad_switch, rtol=1e-4, atol=1e-6)
    assert float(jnp.abs(grad_ours).max()) > 1e-2  # the output's gradient reaches the router


def test_experts_run_on_capacity_rows_not_on_every_token():
    x_NE, router_EX, _ = inputs()
    routing = M.route(x_NE, router_EX, R)
    capacity = M.expert_capacity(N, X, R, capacity_factor=1.25)
    assert capacity == 8  # ceil(1.25 · 12 · 2 / 4)
    buffer_XCE = M.dispatch(x_NE, M.dispatch_slots(routing.experts, X, capacity), X, capacity)
    assert buffer_XCE.shape == (X, capacity, E)
    assert X * capacity == 32 < N * X == 48  # rows the experts compute vs every expert on every token


def test_dispatch_serves_first_choices_first_and_drops_past_capacity():
    experts_NR = jnp.array([[0, 1], [0, 2], [1, 0], [0, 3]])
    slots = np.asarray(M.dispatch_slots(experts_NR, num_experts=4, capacity=2))
    drop = 4 * 2
    # expert 0 is filled by the first choices of tokens 0 and 1, so token 3's first choice and token 2's
    # second choice are dropped; at expert 1, token 2's first choice goes before token 0's second choice
    np.testing.assert_array_equal(slots, [[0, 3], [1, 4], [2, drop], [drop, 6]])


def reference(x_NE, router_EX, experts):
    """Each token alone: Σ_k gate_k · FFN_{expert_k}(x) with the plain feed_forward."""
    routing = M.route(x_NE, router_EX, R)
    rows = []
    for t in range(N):
        y = sum(routing.gates[t, j] * F.feed_forward(x_NE[t], experts["w_in_XEF"][e], experts["w_out_XFE"][e],
                                                     activation="gelu")
                for j, e in enumerate(np.asarray(routing.experts[t])))
        rows.append(y)
    return jnp.stack(rows)


@pytest.mark.parametrize("capacity_factor", [X / R, None])  # None, the default: C = N, what inference uses
def test_without_drops_the_mixture_equals_the_per_token_sum(capacity_factor):
    assert M.expert_capacity(N, X, R, capacity_factor) == N
    x_NE, router_EX, experts = inputs()
    y_NE, _ = M.moe_feed_forward(x_NE, router_EX, experts, k=R, capacity_factor=capacity_factor, activation="gelu")
    np.testing.assert_allclose(y_NE, reference(x_NE, router_EX, experts), atol=1e-5)


def test_without_a_capacity_factor_one_expert_serves_every_token_that_chose_it():
    """Inference (capacity_factor None) serves every assignment even when all N tokens pick one expert first, more
    of them than the model width E: a capacity counted along any other axis would drop some."""
    x_NE, router_EX, experts = inputs()
    x_NE, router_EX = jnp.abs(x_NE), router_EX.at[:, 0].set(10.0)  # every token's first choice: expert 0
    assert bool((M.route(x_NE, router_EX, R).experts[:, 0] == 0).all()) and N > E
    y_NE, _ = M.moe_feed_forward(x_NE, router_EX, experts, k=R, activation="gelu")
    np.testing.assert_allclose(y_NE, reference(x_NE, router_EX, experts), atol=1e-5)


def test_dropped_assignments_contribute_nothing():
    x_NE, router_EX, experts = inputs()
    routing = M.route(x_NE, router_EX, R)
    slots = M.dispatch_slots(routing.experts, X, 1)
    y_NE, _ = M.moe_feed_forward(x_NE, router_EX, experts, k=R, capacity_factor=1e-3, activation="gelu")
    kept = np.asarray(slots) < X
    assert 0 < kept.sum() <= X
    full = reference(x_NE, router_EX, experts)
    np.testing.assert_allclose(y_NE[~kept.any(-1)], 0.0)  # tokens with every assignment dropped
    assert not np.allclose(y_NE, full)


def test_balancing_loss_is_one_when_uniform_and_grows_when_concentrated():
    x_NE, _, _ = inputs()
    uniform = M.route(x_NE, jnp.zeros((E, X)), R)
    assert float(M.load_balancing_loss(uniform)) == pytest.approx(1.0)
    biased_EX = jnp.zeros((E, X)).at[:, 0].set(50.0)
    concentrated = M.route(jnp.abs(x_NE), biased_EX, R)  # positive inputs: expert 0 takes every token
    # f_0 = 1/R, P_0 ≈ 1: loss ≈ X / R
    assert float(M.load_balancing_loss(concentrated)) == pytest.approx(X / R, rel=1e-3)


def test_moe_module_adds_shared_experts_and_passes_gradients_to_the_router():
    cfg = tiny(num_experts=4, experts_per_token=2, num_shared_experts=1, capacity_factor=2.0)
    moe = MoE(cfg, rngs=nnx.Rngs(0))
    x_BTE = jax.random.normal(jax.random.key(1), (2, 3, cfg.d_model))
    y_BTE, aux_loss = moe(x_BTE)
    routed, routed_aux = M.moe_feed_forward(
        x_BTE.reshape(6, -1), moe.router[...], {k: v[...] for k, v in moe.experts.items() if v is not None},
        k=2, capacity_factor=2.0, activation=cfg.activation)
    shared = F.feed_forward(x_BTE, moe.shared["w_in_XEF"][0], moe.shared["w_out_XFE"][0], activation=cfg.activation)
    np.testing.assert_allclose(y_BTE, routed.reshape(2, 3, -1) + shared, atol=1e-5)
    assert float(aux_loss) == pytest.approx(float(routed_aux))

    graphdef, state = nnx.split(moe)
    grads = jax.grad(lambda s: jnp.sum(nnx.merge(graphdef, s)(x_BTE)[0] ** 2))(state)
    assert float(jnp.abs(grads["router"][...]).max()) > 0


def test_a_moe_model_drops_assignments_only_when_training_asks():
    """``model(x)`` serves every assignment; ``model(x, drop_tokens=True)`` drops past ``capacity_factor``."""
    x = tokens(2, 16)
    outputs = {}
    for factor in (0.5, 1.25, 2.0):  # 2.0 = X / R: C = N, nothing to drop
        cfg = tiny(num_layers=2, num_experts=4, experts_per_token=2, capacity_factor=factor)
        graphdef, state = nnx.split(build_model(cfg, rngs=nnx.Rngs(0)))  # the same parameters for every factor
        train = jax.jit(lambda state, x: apply(graphdef, state, x, drop_tokens=True))
        outputs[factor] = train(state, x), jax.jit(functools.partial(apply, graphdef))(state, x)
    serving = outputs[1.25][1]
    for _, inference in outputs.values():  # inference ignores the factor
        np.testing.assert_allclose(inference[0], serving[0], atol=1e-6, rtol=0)
        assert float(inference[1]) == pytest.approx(float(serving[1]), rel=1e-6)
    training_at_x_over_k = outputs[2.0][0]
    np.testing.assert_allclose(training_at_x_over_k[0], serving[0], atol=1e-6, rtol=0)
    assert float(training_at_x_over_k[1]) == pytest.approx(float(serving[1]), rel=1e-6)
    gaps = {factor: float(jnp.max(jnp.abs(outputs[factor][0][0] - serving[0]))) for factor in (0.5, 1.25)}
    assert gaps[0.5] > gaps[1.25] > 1e-3  # fewer rows per expert, more drops
