"""Llama, Mistral and Qwen2 (``model_type: llama | mistral | qwen2``): RoPE (rotate-half), RMSNorm, SwiGLU, GQA.

Mistral adds a sliding window; Qwen2 biases its query/key/value projections only. Llama 3.1's
``rope_scaling`` (``rope_type: llama3``) and linear scaling are read; other scalings are refused.
"""

from __future__ import annotations

from typing import Any

from jaxformer.architecture import ModelConfig
from jaxformer.hf.families.common import common_requirements, expect, field, norm_rules, requires, unsupported
from jaxformer.hf.layout import Rule, head_bias, linear, same

MODEL_TYPES = ("llama", "mistral", "qwen2")
PREFIX = "model."  # a bare LlamaModel's checkpoint has no prefix (and no lm_head)
AUTO_CLASS = "AutoModelForCausalLM"
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
TIED = {"lm_head.weight": "model.embed_tokens.weight"}  # what transformers ties when tie_word_embeddings
IGNORED = (".rotary_emb.inv_freq", *TIED)  # a cached buffer; the head when tied


def rope_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """`ModelConfig` RoPE fields from ``rope_parameters`` (transformers ≥ 5) or ``rope_theta``/``rope_scaling``."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    if any(isinstance(value, dict) for value in params.values()):
        raise unsupported("rope_parameters", "per-layer-type", "one RoPE for all layers")
    rope_type = params.get("rope_type", params.get("type", "default"))
    base = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise unsupported("partial_rotary_factor", partial, "1.0 (RoPE on the whole head)")
    fields: dict[str, Any] = {"position": "rope", "rope_base": float(base)}
    if rope_type == "default":
        return fields
    if rope_type == "linear":
        return {**fields, "rope_scale": 1.0 / float(params["factor"])}
    if rope_type == "llama3":
        return {**fields, "rope_scaling": "llama3", "rope_scaling_factor": float(params["factor"]),
                "rope_low_freq_factor": float(params["low_freq_factor"]),
                "rope_high_freq_factor": float(params["high_freq_factor"]),
                "rope_original_max_seq_len": int(params.get("original_max_position_embeddings",
                                                            field(hf, "max_position_embeddings")))}
    raise unsupported("rope_scaling.rope_type", rope_type, "default, linear, llama3")


def to_config(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    model_type = hf["model_type"]
    expect(hf, "hidden_act", "silu", default="silu")
    use_bias, qkv_bias, window = False, None, None
    if model_type == "llama":
        attention_bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
        if attention_bias != mlp_bias:
            raise unsupported("mlp_bias", mlp_bias, f"mlp_bias equal to attention_bias ({attention_bias})")
        use_bias = attention_bias
    elif model_type == "mistral":
        window = hf.get("sliding_window", 4096)  # MistralConfig's default when the key is absent
    else:  # qwen2
        expect(hf, "use_sliding_window", False, default=False)
        qkv_bias = True
    heads = field(hf, "num_attention_heads")
    d_model = field(hf, "hidden_size")
    head_dim = hf.get("head_dim") or d_model // heads
    return ModelConfig(
        family="decoder", vocab_size=field(hf, "vocab_size"), d_model=d_model,
        num_layers=field(hf, "num_hidden_layers"), num_heads=heads,
        num_kv_heads=field(hf, "num_key_value_heads", heads), head_dim=head_dim, d_ff=field(hf, "intermediate_size"),
        max_seq_len=field(hf, "max_position_embeddings"), activation="swiglu", norm="rmsnorm", norm_position="pre",
        norm_eps=float(field(hf, "rms_norm_eps", 1e-6)), use_bias=use_bias, qkv_bias=qkv_bias,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), sliding_window=window, **rope_fields(hf),
    )


def model_type_of(cfg: ModelConfig) -> str:
    if cfg.has_qkv_bias and not cfg.use_bias:
        return "qwen2"
    return "mistral" if cfg.sliding_window else "llama"


def check_export(cfg: ModelConfig) -> None:
    common_requirements(cfg, "Llama")
    requires(cfg, "Llama", family="decoder", position="rope", norm="rmsnorm", norm_position="pre",
             activation="swiglu", logit_bias=False, scale_embeddings=False, embedding_norm=False, num_token_types=0,
             attention_scale=None, scale_head_inputs=False)
    model_type = model_type_of(cfg)
    if cfg.use_bias:
        requires(cfg, "Llama (attention_bias and mlp_bias)", qkv_bias=(None, True), sliding_window=None)
    if model_type == "qwen2":
        requires(cfg, "Qwen2", sliding_window=None, head_dim=cfg.d_model // cfg.num_heads)
    if cfg.rope_scaling == "llama3":
        requires(cfg, "Llama 3.1 RoPE", rope_scale=1.0)


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    model_type = model_type_of(cfg)
    config = {
        "model_type": model_type, "architectures": [ARCHITECTURES[model_type]], "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "rope_theta": cfg.rope_base, "attention_dropout": 0.0,
    }
    if model_type != "qwen2":
        config["head_dim"] = cfg.head_dim
    if model_type == "llama":
        config.update(attention_bias=cfg.use_bias, mlp_bias=cfg.use_bias)
    if model_type == "mistral":
        config["sliding_window"] = cfg.sliding_window
    if model_type == "qwen2":
        config["use_sliding_window"] = False
    if cfg.rope_scaling == "llama3":
        config["rope_scaling"] = {"rope_type": "llama3", "factor": cfg.rope_scaling_factor,
                                  "low_freq_factor": cfg.rope_low_freq_factor,
                                  "high_freq_factor": cfg.rope_high_freq_factor,
                                  "original_max_position_embeddings": cfg.rope_original_max_seq_len}
    elif cfg.rope_scale != 1.0:
        config["rope_scaling"] = {"rope_type": "linear", "factor": 1.0 / cfg.rope_scale}
    return config


def rules(cfg: ModelConfig) -> list[Rule]:
    E, H, K, D, F, V = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size
    out = [same("model.embed_tokens.weight", "embedding.tokens", (V, E))]
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}", f"decoder.blocks.{i}"
        attention, mlp = f"{ours}.attention", f"{ours}.feed_forward"
        out += norm_rules(f"{hf}.input_layernorm", f"{ours}.attention_norms.0", cfg)
        out += [linear(f"{hf}.self_attn.q_proj.weight", f"{attention}.wq", (E,), (H, D), rope=True),
                linear(f"{hf}.self_attn.k_proj.weight", f"{attention}.wk", (E,), (K, D), rope=True),
                linear(f"{hf}.self_attn.v_proj.weight", f"{attention}.wv", (E,), (K, D)),
                linear(f"{hf}.self_attn.o_proj.weight", f"{attention}.wo", (H, D), (E,))]
        if cfg.has_qkv_bias:
            out += [head_bias(f"{hf}.self_attn.q_proj.bias", f"{attention}.bq", H, D, rope=True),
                    head_bias(f"{hf}.self_attn.k_proj.bias", f"{attention}.bk", K, D, rope=True),
                    head_bias(f"{hf}.self_attn.v_proj.bias", f"{attention}.bv", K, D)]
        if cfg.use_bias:
            out.append(same(f"{hf}.self_attn.o_proj.bias", f"{attention}.bo", (E,)))
        out += norm_rules(f"{hf}.post_attention_layernorm", f"{ours}.feed_forward_norms.0", cfg)
        out += [linear(f"{hf}.mlp.gate_proj.weight", f"{mlp}.w_gate", (E,), (F,)),
                linear(f"{hf}.mlp.up_proj.weight", f"{mlp}.w_in", (E,), (F,)),
                linear(f"{hf}.mlp.down_proj.weight", f"{mlp}.w_out", (F,), (E,))]
        if cfg.use_bias:
            out += [same(f"{hf}.mlp.gate_proj.bias", f"{mlp}.b_gate", (F,)),
                    same(f"{hf}.mlp.up_proj.bias", f"{mlp}.b_in", (F,)),
                    same(f"{hf}.mlp.down_proj.bias", f"{mlp}.b_out", (E,))]
    out += norm_rules("model.norm", "decoder.final_norm", cfg)
    if not cfg.tie_embeddings:
        out.append(linear("lm_head.weight", "head.w", (E,), (V,)))
    return out
