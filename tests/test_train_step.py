"""The jitted train step: gradient accumulation equals the full batch, bf16 compute keeps fp32 masters."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxformer.models.pure import apply, init_params
from jaxformer.train.config import load_config
from jaxformer.train.step import init_state, make_eval_pass, make_train_step, next_token_loss

LR = np.float32(1e-2)


@pytest.fixture(scope="module")
def steps():
    """One step from the same parameters and windows ``[B=4, T+1=9]``, by (micro-batches, compute dtype).

    Plain SGD at unit rate, so the parameter change is ``-lr ×`` the (accumulated) gradient itself.
    """
    config = load_config(None, ["model.d_model=16", "model.num_layers=1", "model.num_heads=2", "model.max_seq_len=8",
                                "train.seq_len=8"])
    graphdef, params = init_params(config.model, seed=0)
    windows = np.random.default_rng(0).integers(0, 256, (4, 9)).astype(np.int32)
    optimizer = optax.sgd(1.0)
    results = {}
    for accum, dtype in ((1, "float32"), (2, "float32"), (1, "bfloat16")):
        state = init_state(jax.tree.map(jnp.copy, params), optimizer)
        step = make_train_step(graphdef, optimizer, dtype)
        results[accum, dtype] = step(state, jnp.asarray(windows).reshape(accum, 4 // accum, 9), LR)
    results["eval"] = float(make_eval_pass(graphdef, "float32")(params, jnp.asarray(windows)[None]))
    return results


def test_accumulating_two_micro_batches_matches_the_full_batch(steps):
    full, accumulated = steps[1, "float32"], steps[2, "float32"]
    assert float(accumulated["sums"]["loss"]) == pytest.approx(float(full["sums"]["loss"]), rel=1e-6)
    assert float(accumulated["sums"]["grad_norm"]) == pytest.approx(float(full["sums"]["grad_norm"]), rel=1e-5)
    deltas = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), full["params"], accumulated["params"])
    assert max(jax.tree.leaves(deltas)) < 1e-8  # gradients agree to float32 rounding (lr = 1e-2 scales them)
    assert int(full["step"]) == 1 and int(full["first_nonfinite"]) == -1 and int(full["sums"]["count"]) == 1
    assert float(full["sums"]["loss"]) == pytest.approx(np.log(256), rel=0.02)  # untrained: ~uniform over bytes
    # the running loss is the mean cross-entropy the validation pass computes on the same windows
    assert steps["eval"] == pytest.approx(float(full["sums"]["loss"]), rel=1e-6)


def test_bf16_compute_keeps_fp32_master_weights_and_a_close_loss(steps):
    full, bf16 = steps[1, "float32"], steps[1, "bfloat16"]
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(bf16["params"]))
    assert float(bf16["sums"]["loss"]) == pytest.approx(float(full["sums"]["loss"]), rel=1e-2)
    assert float(bf16["sums"]["grad_norm"]) == pytest.approx(float(full["sums"]["grad_norm"]), rel=5e-2)


def test_the_objective_weights_the_models_unweighted_aux_loss_once():
    overrides = ["model.d_model=16", "model.num_layers=2", "model.num_heads=2", "model.max_seq_len=8",
                 "train.seq_len=8", "model.num_experts=4", "model.experts_per_token=2"]
    windows = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 9)).astype(np.int32))
    results = {}
    for weight in (0.01, 0.5):
        graphdef, params = init_params(load_config(None, [*overrides, f"model.router_aux_loss_weight={weight}"]).model,
                                       seed=0)
        _, aux_loss = apply(graphdef, params, windows[:, :-1], drop_tokens=True)
        objective, cross_entropy = next_token_loss(graphdef, params, windows, jnp.float32)
        results[weight] = float(aux_loss), float(objective), float(cross_entropy)
    (aux, objective, cross_entropy), (aux_half, objective_half, _) = results[0.01], results[0.5]
    assert aux > 0 and aux_half == aux  # the model's loss does not depend on the weight
    assert objective == pytest.approx(cross_entropy + 0.01 * aux, rel=1e-6)
    assert objective_half == pytest.approx(cross_entropy + 0.5 * aux, rel=1e-6)


# 0.5: C = 8 of the 32 tokens per expert; 2.0 = X / K: C = T, nothing dropped
@pytest.mark.parametrize("capacity_factor, drops", [(0.5, True), (2.0, False)])
def test_the_moe_train_step_drops_past_capacity_and_the_validation_pass_never_does(capacity_factor, drops):
    config = load_config(None, ["model.d_model=16", "model.num_layers=2", "model.num_heads=2", "model.max_seq_len=8",
                                "train.seq_len=8", "model.num_experts=4", "model.experts_per_token=2",
                                f"model.capacity_factor={capacity_factor}"])
    graphdef, params = init_params(config.model, seed=0)
    windows = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 9)).astype(np.int32))
    optimizer = optax.sgd(1.0)
    state = init_state(jax.tree.map(jnp.copy, params), optimizer)  # donated to the step
    trained = make_train_step(graphdef, optimizer, "float32")(state, windows[None], LR)
    eval_loss = float(make_eval_pass(graphdef, "float32")(params, windows[None]))

    def objective(drop_tokens):
        loss_fn = lambda p: next_token_loss(graphdef, p, windows, jnp.float32, drop_tokens=drop_tokens)
        (_, cross_entropy), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return float(cross_entropy), grads

    (train_loss, train_grads), (no_drop_loss, no_drop_grads) = objective(True), objective(False)
    # the step trains on the objective that drops (its recorded loss and gradient norm), validation serves all
    assert float(trained["sums"]["loss"]) == pytest.approx(train_loss, rel=1e-6)
    assert float(trained["sums"]["grad_norm"]) == pytest.approx(float(optax.tree.norm(train_grads)), rel=1e-5)
    assert eval_loss == pytest.approx(no_drop_loss, rel=1e-6)
    w_in = lambda grads: grads["decoder"]["blocks"][0]["feed_forward"]["experts"]["w_in_XEF"][...]
    gap = float(jnp.max(jnp.abs(w_in(train_grads) - w_in(no_drop_grads))) / jnp.max(jnp.abs(w_in(no_drop_grads))))
    if drops:
        assert gap > 0.1  # a dropped assignment sends its expert no gradient
        assert train_loss != pytest.approx(eval_loss, rel=1e-6)
    else:
        assert gap < 1e-6
        assert train_loss == pytest.approx(eval_loss, rel=1e-6)
