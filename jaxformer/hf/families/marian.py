"""Marian (``model_type: marian``, the OPUS-MT translation models): a post-LayerNorm encoder–decoder.

Sinusoidal positions laid out sines-then-cosines, token embeddings scaled by √d
(``scale_embedding``), one embedding shared by encoder, decoder and the tied head, and a
logit bias (``final_logits_bias``; a checkpoint without one is a model without one, as transformers
then starts the buffer at zeros). The decoder starts from ``decoder_start_token_id``.
"""

from __future__ import annotations

from typing import Any

from jaxformer.architecture import ModelConfig
from jaxformer.hf.families.common import (ACTIVATIONS_OUT, activation_in, common_requirements, expect, field,
                                          norm_rules, requires, unsupported)
from jaxformer.hf.layout import Rule, copies, head_bias, linear, same

MODEL_TYPES = ("marian",)
PREFIX = ""
ARCHITECTURE = "MarianMTModel"
AUTO_CLASS = "AutoModelForSeq2SeqLM"
TIED = {name: "model.shared.weight"  # what transformers ties when tie_word_embeddings
        for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")}
# the shared embedding's copies and the tied head; the sinusoid tables (computed, not learned)
IGNORED = (*TIED, ".embed_positions.weight")
# before transformers 5 both stacks' embed_tokens were model.shared itself (saved under that name)
ALIASES = {"model.encoder.embed_tokens.weight": "model.shared.weight",
           "model.decoder.embed_tokens.weight": "model.shared.weight"}
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which Marian uses


def to_config(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    expect(hf, "share_encoder_decoder_embeddings", True, default=True)
    for encoder_name, decoder_name in (("encoder_attention_heads", "decoder_attention_heads"),
                                       ("encoder_ffn_dim", "decoder_ffn_dim")):
        if field(hf, encoder_name) != field(hf, decoder_name):
            raise unsupported(decoder_name, hf[decoder_name], f"{decoder_name} equal to {encoder_name}")
    vocab = field(hf, "vocab_size")
    if hf.get("decoder_vocab_size", vocab) not in (None, vocab):
        raise unsupported("decoder_vocab_size", hf["decoder_vocab_size"], "one vocabulary (vocab_size)")
    return ModelConfig(
        family="encoder_decoder", vocab_size=vocab, d_model=field(hf, "d_model"),
        num_layers=field(hf, "decoder_layers"), num_encoder_layers=field(hf, "encoder_layers"),
        num_heads=field(hf, "encoder_attention_heads"), d_ff=field(hf, "encoder_ffn_dim"),
        max_seq_len=field(hf, "max_position_embeddings"), activation=activation_in(hf, "activation_function"),
        norm="layernorm", norm_position="post", norm_eps=LAYER_NORM_EPS, position="sinusoidal",
        sinusoidal_layout="split", use_bias=True, tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        scale_embeddings=bool(hf.get("scale_embedding", False)), logit_bias="final_logits_bias" in names,
    )


def check_export(cfg: ModelConfig) -> None:
    common_requirements(cfg, "Marian")
    requires(cfg, "Marian", family="encoder_decoder", position="sinusoidal", sinusoidal_layout="split",
             norm="layernorm", norm_position="post", norm_eps=LAYER_NORM_EPS, use_bias=True, qkv_bias=(None, True),
             num_kv_heads=cfg.num_heads, head_dim=cfg.d_model // cfg.num_heads, activation=tuple(ACTIVATIONS_OUT),
             embedding_norm=False, num_token_types=0, attention_scale=None, scale_head_inputs=False, sliding_window=None)


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "model_type": "marian", "architectures": [ARCHITECTURE], "vocab_size": cfg.vocab_size,
        "decoder_vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "encoder_layers": cfg.num_encoder_layers,
        "decoder_layers": cfg.num_layers, "encoder_attention_heads": cfg.num_heads,
        "decoder_attention_heads": cfg.num_heads, "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
        "max_position_embeddings": cfg.max_seq_len, "activation_function": ACTIVATIONS_OUT[cfg.activation],
        "scale_embedding": cfg.scale_embeddings, "tie_word_embeddings": cfg.tie_embeddings,
        "share_encoder_decoder_embeddings": True, "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
        "is_encoder_decoder": True,
    }


def _attention(hf: str, ours: str, cfg: ModelConfig) -> list[Rule]:
    E, H, D = cfg.d_model, cfg.num_heads, cfg.head_dim
    out = []
    for name, w, b in (("q_proj", "wq", "bq"), ("k_proj", "wk", "bk"), ("v_proj", "wv", "bv")):
        out += [linear(f"{hf}.{name}.weight", f"{ours}.{w}", (E,), (H, D)),
                head_bias(f"{hf}.{name}.bias", f"{ours}.{b}", H, D)]
    return out + [linear(f"{hf}.out_proj.weight", f"{ours}.wo", (H, D), (E,)),
                  same(f"{hf}.out_proj.bias", f"{ours}.bo", (E,))]


def _feed_forward(hf: str, ours: str, cfg: ModelConfig) -> list[Rule]:
    E, F = cfg.d_model, cfg.d_ff
    return [linear(f"{hf}.fc1.weight", f"{ours}.w_in", (E,), (F,)), same(f"{hf}.fc1.bias", f"{ours}.b_in", (F,)),
            linear(f"{hf}.fc2.weight", f"{ours}.w_out", (F,), (E,)), same(f"{hf}.fc2.bias", f"{ours}.b_out", (E,))]


def rules(cfg: ModelConfig) -> list[Rule]:
    V, E = cfg.vocab_size, cfg.d_model
    # untied, transformers ties neither stack's embed_tokens to shared: each is read (they must agree) and written
    embedding = same("model.shared.weight", "embedding.tokens", (V, E)) if cfg.tie_embeddings else copies(
        ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "model.shared.weight"),
        "embedding.tokens", (V, E), read=2)
    out = [embedding]
    if cfg.logit_bias:  # left out otherwise: the buffer transformers zeros when a checkpoint lacks it
        out.append(same("final_logits_bias", "head.bias", (V,), (1, V)))
    for stack, layers in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_layers)):
        for i in range(layers):
            hf, ours = f"model.{stack}.layers.{i}", f"{stack}.blocks.{i}"
            out += _attention(f"{hf}.self_attn", f"{ours}.attention", cfg)
            out += norm_rules(f"{hf}.self_attn_layer_norm", f"{ours}.attention_norms.0", cfg)
            if stack == "decoder":
                out += _attention(f"{hf}.encoder_attn", f"{ours}.cross_attention", cfg)
                out += norm_rules(f"{hf}.encoder_attn_layer_norm", f"{ours}.cross_attention_norms.0", cfg)
            out += _feed_forward(hf, f"{ours}.feed_forward", cfg)
            out += norm_rules(f"{hf}.final_layer_norm", f"{ours}.feed_forward_norms.0", cfg)
    if not cfg.tie_embeddings:
        out.append(linear("lm_head.weight", "head.w", (E,), (V,)))
    return out
