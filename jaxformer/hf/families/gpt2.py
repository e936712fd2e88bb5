"""GPT-2 (``model_type: gpt2``): learned positions, pre-LayerNorm, fused ``c_attn``, ``Conv1D`` weights; the head tied
to the token embeddings unless ``tie_word_embeddings`` is false (then ``lm_head.weight`` is read), as transformers does."""

from __future__ import annotations

from typing import Any

from jaxformer.architecture import ModelConfig
from jaxformer.hf.families.common import (ACTIVATIONS_OUT, activation_in, common_requirements, expect, field,
                                          norm_rules, requires)
from jaxformer.hf.layout import Rule, fused, linear, same

MODEL_TYPES = ("gpt2",)
PREFIX = "transformer."  # GPT2Model checkpoints (the published gpt2) have no prefix
ARCHITECTURE = "GPT2LMHeadModel"
AUTO_CLASS = "AutoModelForCausalLM"
TIED = {"lm_head.weight": "transformer.wte.weight"}  # what transformers ties when tie_word_embeddings
IGNORED = (".attn.bias", ".attn.masked_bias", *TIED)  # causal-mask buffers; the head when tied


def to_config(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    for name in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        expect(hf, name, False, default=False)
    expect(hf, "scale_attn_weights", True, default=True)
    d_model = field(hf, "n_embd")
    return ModelConfig(
        family="decoder", vocab_size=field(hf, "vocab_size"), d_model=d_model, num_layers=field(hf, "n_layer"),
        num_heads=field(hf, "n_head"), d_ff=field(hf, "n_inner", 4 * d_model), max_seq_len=field(hf, "n_positions"),
        activation=activation_in(hf, "activation_function"), norm="layernorm", norm_position="pre",
        norm_eps=field(hf, "layer_norm_epsilon", 1e-5), position="learned", use_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def check_export(cfg: ModelConfig) -> None:
    common_requirements(cfg, "GPT-2")
    requires(cfg, "GPT-2", family="decoder", position="learned", norm="layernorm", norm_position="pre",
             use_bias=True, qkv_bias=(None, True), num_kv_heads=cfg.num_heads, head_dim=cfg.d_model // cfg.num_heads,
             activation=tuple(ACTIVATIONS_OUT), sliding_window=None, logit_bias=False, scale_embeddings=False,
             embedding_norm=False, num_token_types=0, attention_scale=None, scale_head_inputs=False)


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "model_type": "gpt2", "architectures": [ARCHITECTURE], "vocab_size": cfg.vocab_size, "n_embd": cfg.d_model,
        "n_layer": cfg.num_layers, "n_head": cfg.num_heads, "n_inner": cfg.d_ff, "n_positions": cfg.max_seq_len,
        "activation_function": ACTIVATIONS_OUT[cfg.activation], "layer_norm_epsilon": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "scale_attn_weights": True, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }


def rules(cfg: ModelConfig) -> list[Rule]:
    E, H, D, F = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff
    out = [same("transformer.wte.weight", "embedding.tokens", (cfg.vocab_size, E)),
           same("transformer.wpe.weight", "embedding.positions", (cfg.max_seq_len, E))]
    for i in range(cfg.num_layers):
        hf, ours = f"transformer.h.{i}", f"decoder.blocks.{i}"
        attention = f"{ours}.attention"
        out += norm_rules(f"{hf}.ln_1", f"{ours}.attention_norms.0", cfg)
        out += [
            fused(f"{hf}.attn.c_attn.weight", [f"{attention}.{w}" for w in ("wq", "wk", "wv")], [(E, H, D)] * 3,
                  axis=1),
            fused(f"{hf}.attn.c_attn.bias", [f"{attention}.{b}" for b in ("bq", "bk", "bv")], [(H, D)] * 3, axis=0),
            same(f"{hf}.attn.c_proj.weight", f"{attention}.wo", (H, D, E), (H * D, E)),
            same(f"{hf}.attn.c_proj.bias", f"{attention}.bo", (E,)),
            same(f"{hf}.mlp.c_fc.weight", f"{ours}.feed_forward.w_in", (E, F)),
            same(f"{hf}.mlp.c_fc.bias", f"{ours}.feed_forward.b_in", (F,)),
            same(f"{hf}.mlp.c_proj.weight", f"{ours}.feed_forward.w_out", (F, E)),
            same(f"{hf}.mlp.c_proj.bias", f"{ours}.feed_forward.b_out", (E,)),
        ]
        out += norm_rules(f"{hf}.ln_2", f"{ours}.feed_forward_norms.0", cfg)
    out += norm_rules("transformer.ln_f", "decoder.final_norm", cfg)
    if not cfg.tie_embeddings:
        out.append(linear("lm_head.weight", "head.w", (E,), (cfg.vocab_size,)))
    return out
