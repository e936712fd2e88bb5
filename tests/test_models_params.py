"""The modules hold exactly the parameters the accounting counts, component by component, with logical axes."""

from __future__ import annotations

import math
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from jaxformer.accounting import count_params
from jaxformer.models import PRESETS, build_model, get_preset, init_params, logical_axes
from jaxformer.models.presets import model_config_from_dict
from jaxformer.nn.params import AXIS_NAMES

# reduced sizes that keep each preset's architecture (GQA ratio, SwiGLU, biases, tying, norms, MoE…)
SMALL = dict(d_model=32, num_heads=4, num_layers=2, vocab_size=48, max_seq_len=24)
KV_HEADS = {"llama3-8b": 2, "mistral-7b": 2}


def small(name: str, **overrides):
    extra = {"num_kv_heads": KV_HEADS[name]} if name in KV_HEADS else {}
    if get_preset(name).family == "encoder_decoder":
        extra["num_encoder_layers"] = 3
    if get_preset(name).sliding_window:
        extra["sliding_window"] = 8
    return model_config_from_dict({"preset": name, **SMALL, **extra, **overrides})


def component(path: tuple) -> str:
    """The accounting's breakdown key for a parameter at ``path``."""
    names = [str(p) for p in path]
    if names[0] == "embedding":
        return {"tokens": "token_embedding", "positions": "position_embedding",
                "token_types": "token_type_embedding", "norm": "embedding_norm"}[names[1]]
    if names[0] == "pooler":
        return "pooler"
    if names[-1] == "relative_bias":  # T5: one table per stack
        return "relative_bias"
    if names[0] == "head":
        if names == ["head", "bias"]:
            return "logit_bias"
        return "output_head" if names[-2:] in (["head", "w"], ["output", "w"]) else "mlm_head"
    if any(n.endswith("norms") or n == "final_norm" for n in names):
        return "norms"
    for name in ("router", "cross_attention", "attention", "feed_forward"):
        if name in names:
            return name
    raise AssertionError(f"unclassified parameter {path}")


def held_breakdown(cfg) -> dict[str, int]:
    abstract = nnx.eval_shape(lambda: build_model(cfg, rngs=nnx.Rngs(0)))
    held: dict[str, int] = {}
    for path, variable in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
        held[component(path)] = held.get(component(path), 0) + math.prod(variable.shape)
    return held


@pytest.mark.parametrize("name", list(PRESETS))
def test_modules_hold_the_accounted_parameters_component_by_component(name):
    cfg = small(name)
    expected = {k: v for k, v in count_params(cfg).breakdown.items() if v}
    assert held_breakdown(cfg) == expected


@pytest.mark.parametrize("overrides", [
    dict(norm_position="sandwich", use_bias=True, activation="swiglu", tie_embeddings=False),
    dict(num_shared_experts=2, use_bias=True, expert_d_ff=40, activation="swiglu"),
    dict(position="sinusoidal", norm="rmsnorm", num_kv_heads=1),
    # the Hugging Face options (#19): Qwen2's q/k/v-only biases, a logit bias, untied + tanh GELU
    dict(use_bias=False, qkv_bias=True, logit_bias=True, activation="gelu_tanh", tie_embeddings=False),
    dict(use_bias=True, qkv_bias=False, scale_embeddings=True, activation="silu"),
    # BERT: token types, the embedding LayerNorm, the pooler; a bare encoder without the masked-LM head
    dict(family="encoder", norm_position="post", num_token_types=2, embedding_norm=True, pooler=True),
    dict(family="encoder", norm_position="post", num_token_types=3, embedding_norm=True, mlm_head=False,
         tie_embeddings=False),
    # a bias-free encoder (ModernBERT-like): the masked-LM head's dense layer and vocabulary without biases
    dict(family="encoder", use_bias=False, norm="rmsnorm", tie_embeddings=False),
    dict(family="encoder_decoder", num_encoder_layers=2, position="sinusoidal", sinusoidal_layout="split",
         logit_bias=True, norm_position="post"),
    # T5 v1.1: relative position bias tables, gated GELU, no biases, an untied rescaled head
    dict(family="encoder_decoder", num_encoder_layers=3, position="relative_bias", relative_attention_num_buckets=16,
         activation="geglu_tanh", use_bias=False, norm="rmsnorm", tie_embeddings=False, scale_head_inputs=True,
         attention_scale=1.0),
    dict(position="relative_bias", activation="geglu", use_bias=False),  # a decoder LM with T5's biases
])
def test_variants_hold_the_accounted_parameters(overrides):
    base = "moe-8x-top2" if "num_shared_experts" in overrides else "gpt2"
    cfg = small(base, **overrides)
    assert held_breakdown(cfg) == {k: v for k, v in count_params(cfg).breakdown.items() if v}


def test_full_size_gpt2_holds_its_published_count():
    abstract = nnx.eval_shape(lambda: build_model(get_preset("gpt2"), rngs=nnx.Rngs(0)))
    assert sum(math.prod(p.shape) for p in jax.tree.leaves(nnx.state(abstract, nnx.Param))) == 124_439_808


def abstract_params(cfg):
    """The ``init_params`` state as shapes only (nothing is computed or compiled)."""
    return nnx.eval_shape(lambda: init_params(cfg, seed=0))[1]


def test_moe_total_and_active_match_the_accounting():
    cfg = small("moe-8x-top2", num_shared_experts=1, num_experts=6, experts_per_token=2)
    params = abstract_params(cfg)
    axes = logical_axes(params)
    sizes = jax.tree.map(lambda p: math.prod(p.shape), params)
    total = sum(jax.tree.leaves(sizes))
    # a token uses k of the E routed experts (leading "experts" axis), the router and everything else
    share = cfg.experts_per_token / cfg.num_experts
    active = sum(size * (share if names[0] == "experts" else 1)
                 for names, size in zip(jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple)),
                                        jax.tree.leaves(sizes)))
    counted = count_params(cfg)
    assert total == counted.total
    assert active == counted.active < counted.total


def test_residual_projections_start_at_gpt2s_scale_for_the_depth_of_their_own_stack():
    """N(0, 0.02²) weights; the projections into the residual stream 0.02/√(2·layers) with the layers of their own
    stack: an encoder of 2 layers under a decoder of 8 is scaled for 2, the decoder (and its MoE experts) for 8."""

    from jaxformer.models import ModelConfig

    cfg = ModelConfig(family="encoder_decoder", num_encoder_layers=2, num_layers=8, d_model=256, num_heads=4,
                      vocab_size=64, max_seq_len=16, num_experts=4, experts_per_token=1, expert_d_ff=256)
    stds: dict[tuple[str, str], list[float]] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(init_params(cfg, 0)[1]):
        keys = [str(getattr(k, "key", k)) for k in path]
        stds.setdefault((keys[0], keys[-2]), []).append(float(np.std(np.asarray(leaf))))
    for (stack, name), values in stds.items():
        if name in ("wo", "w_out_XFE"):
            layers = cfg.num_encoder_layers if stack == "encoder" else cfg.num_layers
            assert np.allclose(values, 0.02 / math.sqrt(2 * layers), rtol=0.03), (stack, name, values)
        elif name in ("wq", "w_in_XEF", "router"):
            assert np.allclose(values, 0.02, rtol=0.05), (stack, name, values)


def test_every_parameter_names_its_axes():
    params = abstract_params(small("moe-8x-top2", num_shared_experts=1, use_bias=True))
    axes = logical_axes(params)
    pairs = zip(jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple)), jax.tree.leaves(params))
    for names, value in pairs:
        assert len(names) == value.ndim and set(names) - {None} <= set(AXIS_NAMES)
    assert axes["embedding"]["tokens"] == ("vocab", "embed")
    assert axes["decoder"]["blocks"][0]["attention"]["wk"] == ("embed", "kv_heads", "head_dim")
    assert axes["decoder"]["blocks"][0]["feed_forward"]["experts"]["w_in_XEF"] == ("experts", "embed", "mlp")


def test_models_package_imports_without_flax():
    code = "import sys, jaxformer.models; jaxformer.models.get_preset('gpt2'); print('flax' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("name, published", [("gpt2", {}), ("gpt2-medium", dict(n_embd=1024, n_layer=24, n_head=16))])
def test_gpt2_presets_are_the_published_architecture(name, published):
    import torch
    import transformers
    from transformers.activations import ACT2FN

    from jaxformer.functional.feedforward import ACTIVATIONS
    from jaxformer.hf.families import gpt2

    config = transformers.GPT2Config(**published)  # defaults: the published gpt2 (124M)
    assert get_preset(name) == gpt2.to_config(config.to_dict(), set())
    x = np.linspace(-6.0, 6.0, 4001, dtype=np.float32)
    ours = np.asarray(ACTIVATIONS[get_preset(name).activation](x))
    peer = ACT2FN[config.activation_function](torch.from_numpy(x)).numpy()  # gelu_new
    assert np.abs(ours - peer).max() < 1e-6


def test_transformer_base_embeds_as_the_paper_does():

    from jaxformer.nn import Embedding

    cfg = get_preset("transformer-base")
    embedding = Embedding(cfg, rngs=nnx.Rngs(0))
    tokens = np.array([[5, 36999, 0, 123]])
    # §3.4: embedding weights times √d_model; §3.5: plus PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(…)
    angles = np.arange(4)[:, None] / 10000.0 ** (np.arange(0, 512, 2) / 512)
    positions = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(4, 512)
    expected = np.asarray(embedding.tokens[...])[tokens] * np.sqrt(512) + positions
    np.testing.assert_allclose(np.asarray(embedding(tokens)), expected, atol=1e-5)


def test_a_resized_preset_keeps_its_query_heads_per_kv_head():
    """Llama 3 8B's four query heads per K/V head survive a new width or head count (the sweep's size rule,
    `sweep.sizing`, keeps them by the same rule, `grouped_kv_heads`; MaxText keeps num_kv_heads when only the width
    changes): a preset with d_model 1024 was multi-head attention, 32 K/V heads. Heads 4 does not divide are
    refused naming the field, as MaxText and Levanter refuse them, not silently multi-head."""
    def heads(**overrides) -> tuple[int, int]:
        config = model_config_from_dict({"preset": "llama3-8b", **overrides})
        return config.num_heads, config.num_kv_heads

    assert heads(d_model=1024) == (32, 8)
    assert heads(d_model=1024, num_heads=8) == (8, 2)
    with pytest.raises(ValueError) as refused:  # 4 does not divide 6: it was multi-head attention, 6 K/V heads
        heads(d_model=3072, num_heads=6)
    assert str(refused.value) == ("model.num_heads: 6 is not a multiple of preset llama3-8b's 4 query heads per K/V "
                                  "head; give a multiple of 4, or set model.num_kv_heads")
    assert heads(d_model=3072, num_heads=6, num_kv_heads=2) == (6, 2)
    assert heads(d_model=1024, num_kv_heads=1) == (32, 1)  # the user's own count stays
    assert model_config_from_dict({"preset": "mistral-7b", "d_model": 2048}).num_kv_heads == 8
    tiny = model_config_from_dict({"preset": "tiny", "d_model": 64})
    assert tiny.num_kv_heads == tiny.num_heads == 4
