"""The PyTorch twin of `jaxformer bench train` and `bench sweep` trains jaxformer's model and optimizer: the same
logits from the same parameters, every parameter loaded, jaxformer's initialisation and weight-decay mask, the
same validation passes and saves; what it cannot reproduce is refused; a stale schedule is refused."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer.benchmarks.replay import ReplayedRun
from jaxformer.benchmarks.torch_reference import TorchDecoder, init_like_jaxformer, load_jax_params, make_torch_step
from jaxformer.benchmarks.torch_twin import save_schedules, train_twin, twin_runs, unsupported
from jaxformer.benchmarks.twin_model import jaxformer_init_stds
from jaxformer.models import get_preset
from jaxformer.models.pure import apply, init_params
from jaxformer.train.config import config_from_dict, config_to_dict
from jaxformer.train.loop import due_at

SMALL = {"num_layers": 2, "d_model": 32, "num_heads": 2, "num_kv_heads": 2, "d_ff": 64}


def _perturbed(cfg):
    """jaxformer's parameters of ``cfg`` with noise added to every array (its biases start at 0, so a bias the twin
    failed to load would not show), as the pure state and the pure dict."""
    graphdef, params = init_params(cfg, seed=0)
    rng = np.random.default_rng(1)
    pure = jax.tree.map(lambda x: jnp.asarray(np.asarray(x) + 0.3 * rng.standard_normal(x.shape, np.float32)),
                        nnx.to_pure_dict(params))
    nnx.replace_by_pure_dict(params, pure)
    return graphdef, params, pure


@pytest.mark.parametrize("changes", [
    {},  # the tiny preset: RMSNorm, SwiGLU, RoPE, no biases, tied head
    {"norm": "layernorm", "position": "learned", "use_bias": True, "tie_embeddings": False, "activation": "gelu"},
    {"activation": "gelu_tanh"}, {"activation": "silu"}, {"activation": "relu", "use_bias": True},
    {"qkv_bias": True}, {"use_bias": True, "qkv_bias": False}, {"num_kv_heads": 1, "rope_scale": 0.5},
    {"position": "none"},
])
def test_the_twin_computes_jaxformers_logits_from_the_same_parameters(changes):
    cfg = dataclasses.replace(get_preset("tiny"), **{**SMALL, **changes})
    graphdef, params, pure = _perturbed(cfg)
    tokens = np.random.default_rng(0).integers(0, 256, (2, 16))
    logits_jax = np.asarray(apply(graphdef, params, jnp.asarray(tokens))[0])
    twin = TorchDecoder(cfg)
    load_jax_params(twin, pure)
    logits_torch = twin(torch.from_numpy(tokens)).detach().numpy()
    assert sum(p.numel() for p in twin.parameters()) == sum(np.size(x) for x in jax.tree.leaves(pure))
    assert np.abs(logits_jax).max() > 1 and np.abs(logits_jax - logits_torch).max() < 1e-4


def test_loading_refuses_parameters_that_do_not_cover_the_twin():
    """A bias-free jaxformer model into a twin with biases (or the reverse) is refused, never half-loaded."""
    plain = dataclasses.replace(get_preset("tiny"), **SMALL)
    biased = dataclasses.replace(plain, use_bias=True)
    with pytest.raises(ValueError, match="no bias"):
        load_jax_params(TorchDecoder(biased), nnx.to_pure_dict(init_params(plain, seed=0)[1]))
    with pytest.raises(ValueError, match="copied"):
        load_jax_params(TorchDecoder(plain), nnx.to_pure_dict(init_params(biased, seed=0)[1]))


@pytest.mark.parametrize("field, value", [("embedding_norm", True), ("scale_embeddings", True), ("logit_bias", True),
                                          ("rope_scaling", "llama3"), ("num_token_types", 2),
                                          ("init_from", "some/checkpoint")])
def test_the_twin_refuses_what_it_cannot_reproduce(field, value):
    config = config_from_dict({"model": {"preset": "tiny", **SMALL}})
    model = dataclasses.replace(config.model, **{field: value})
    assert unsupported(dataclasses.replace(config, model=model)).startswith(f"model.{field}={value!r}")
    if field != "init_from":  # not architecture: the model itself is one the twin computes
        with pytest.raises(ValueError, match=f"the PyTorch twin cannot train model.{field}="):
            TorchDecoder(model)


def test_the_twin_starts_from_jaxformers_initialisation():
    """Weights and embeddings N(0, 0.02²), residual outputs N(0, (0.02/√(2L))²), biases 0, norm scales 1 (not
    PyTorch's N(0, 1) embeddings, which start a tied model at a loss of ~15 instead of ~ln V)."""
    cfg = dataclasses.replace(get_preset("tiny"), **SMALL, norm="layernorm", use_bias=True)
    stds = jaxformer_init_stds(cfg)
    assert stds == pytest.approx((0.02, 0.02 / 2.0))
    twin = TorchDecoder(cfg)
    torch.manual_seed(0)
    init_like_jaxformer(twin, stds)
    parameters = dict(twin.named_parameters())
    for name in ("tokens.weight", "blocks.0.wq.weight", "blocks.1.w_in.weight", "blocks.1.w_gate.weight"):
        assert parameters[name].std().item() == pytest.approx(0.02, rel=0.1), name
    for name in ("blocks.0.wo.weight", "blocks.1.w_out.weight"):
        assert parameters[name].std().item() == pytest.approx(0.01, rel=0.1), name
    biases = [p for name, p in parameters.items() if name.endswith("bias")]
    scales = [twin.norm.weight, *(block.norm1.weight for block in twin.blocks)]
    assert len(biases) > 10 and all(not p.any() for p in biases) and all((p == 1).all() for p in scales)
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (4, 17)))
    loss = torch.nn.functional.cross_entropy(twin(tokens[:, :-1]).reshape(-1, 256), tokens[:, 1:].reshape(-1))
    assert abs(loss.item() - np.log(256)) < 0.2


def test_bench_trains_twin_decays_matrices_only():
    """As jaxformer's `decay_mask`: matrices and embedding tables decayed, norm scales and biases not."""
    cfg = dataclasses.replace(get_preset("tiny"), **SMALL, norm="layernorm", use_bias=True)
    step = make_torch_step(cfg, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8, grad_clip=1.0)
    decay = {id(p): group["weight_decay"] for group in step.optimizer.param_groups for p in group["params"]}
    model_parameters = [p for group in step.optimizer.param_groups for p in group["params"]]
    assert len(decay) == len(model_parameters) > 20
    assert all(decay[id(p)] == (0.1 if p.ndim >= 2 else 0.0) for p in model_parameters)


def _planned(changes: dict, name: str = "run") -> tuple[ReplayedRun, object]:
    base = {"model": {"preset": "tiny", "d_model": 32, "num_layers": 1, "num_heads": 2, "max_seq_len": 32},
            "train": {"batch_size": 4, "seq_len": 16, "tokens": 4 * 16 * 7, "eval_tokens": 64},
            "optimizer": {"lr": 1e-2, "warmup_fraction": 0.3, "final_lr_fraction": 0.2}}
    for section, values in changes.items():
        base[section] = {**base.get(section, {}), **values}
    config = config_from_dict(base)
    return ReplayedRun(name, config.total_steps, config_to_dict(config)), config


def test_the_twin_evaluates_and_saves_at_jaxformers_steps(tmp_path):
    """``train.eval_interval`` and ``checkpoint.steps``: the steps jaxformer's loop evaluates and saves at (`due_at`,
    with no ``checkpoint.max_overhead`` to skip a save)."""
    planned, config = _planned({"train": {"eval_interval": 2}, "checkpoint": {"interval": 100, "steps": [3]}})
    steps = range(1, config.total_steps + 1)
    evaluated = [step for step in steps if due_at(config, step, lambda: False)[1]]
    saved = [step for step in steps if due_at(config, step, lambda: False)[2]]
    assert evaluated[-1] == saved[-1] == config.total_steps and len(evaluated) > 2 and len(saved) > 1
    (run,) = twin_runs([planned], checkpoint_dir=str(tmp_path))
    tokens = np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8)
    record = train_twin(run, tokens[:3000], tokens[3000:])
    assert [step for step, _ in record["val_losses"]] == evaluated
    assert record["val_loss"] == record["val_losses"][-1][1] and record["val_losses"][0][1] > record["val_loss"]
    assert sorted(int(path.stem) for path in (tmp_path / "run").iterdir()) == saved
    assert {path.suffix for path in (tmp_path / "run").iterdir()} == {".pt"}


def test_a_schedule_computed_for_another_config_is_refused(tmp_path):
    """A schedules file left by an earlier spec (same run name and length, another learning rate)."""
    earlier, _ = _planned({"optimizer": {"lr": 3e-3}})
    save_schedules([earlier], tmp_path / "schedules.npz")
    now, config = _planned({})
    with np.load(tmp_path / "schedules.npz") as arrays:
        given = {name: arrays[name] for name in arrays.files}
    with pytest.raises(ValueError, match="run run: the given schedule was computed for another optimizer section"):
        twin_runs([now], schedules=given)
    (run,) = twin_runs([earlier], schedules=given)
    assert run.learning_rates.max() == pytest.approx(3e-3)
