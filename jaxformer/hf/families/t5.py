"""T5 (``model_type: t5``: T5, T5 v1.1, Flan-T5): a pre-RMSNorm encoder–decoder with relative position biases.

No position embeddings: each stack's first layer holds a ``[relative_attention_num_buckets, num_heads]``
bias of the bucketed query–key distance that all its self-attention layers add (bidirectional
buckets in the encoder, causal ones in the decoder, none in cross-attention). Scores are not
scaled by ``1/√d_kv``; nothing has a bias; the norm is RMSNorm (``T5LayerNorm``). The FFN is
``feed_forward_proj``: ``relu`` (T5) or ``gated-gelu`` (T5 v1.1, Flan-T5: a tanh-GELU gate). One
embedding (``shared``) serves encoder, decoder and, when tied, the head, whose input T5 scales by
``d_model**-0.5`` (``scale_decoder_outputs``; before transformers 5, ``tie_word_embeddings``).
"""

from __future__ import annotations

from typing import Any

from jaxformer.architecture import ModelConfig
from jaxformer.hf.families.common import (ACTIVATIONS_IN, ACTIVATIONS_OUT, common_requirements, expect, field,
                                          norm_rules, requires, unsupported)
from jaxformer.hf.layout import Rule, linear, same

MODEL_TYPES = ("t5",)
PREFIX = ""
ARCHITECTURE = "T5ForConditionalGeneration"
AUTO_CLASS = "AutoModelForSeq2SeqLM"
TIED = {name: "shared.weight"  # what transformers ties when the head is tied
        for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")}
# the shared embedding's copies and the tied head; the cross-attention bias old checkpoints carry unused
IGNORED = (*TIED, "EncDecAttention.relative_attention_bias.weight")
# ``gated-ACT`` -> `ModelConfig.activation`; ``gated-gelu`` itself means gelu_new (T5Config's alias), so an
# exact-GELU gate is written as ``gated-gelu_python`` (transformers' erf GELU, under a name T5Config keeps)
GATED_IN = {"gelu": "geglu", "gelu_python": "geglu", "gelu_new": "geglu_tanh", "gelu_pytorch_tanh": "geglu_tanh",
            "silu": "swiglu", "swish": "swiglu"}
FEED_FORWARD_OUT = {**ACTIVATIONS_OUT, "geglu": "gated-gelu_python", "geglu_tanh": "gated-gelu", "swiglu": "gated-silu"}
DEFAULT_MAX_SEQ_LEN = 512  # T5's training length; relative positions set no hard limit


def _activation(hf: dict[str, Any]) -> str:
    """``feed_forward_proj`` (``ACT`` or ``gated-ACT``), read as `transformers.T5Config` does."""
    proj = str(field(hf, "feed_forward_proj", "relu"))
    parts = proj.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]  # T5Config's backward-compatible alias
    table = GATED_IN if gated else ACTIVATIONS_IN
    if len(parts) > 2 or (len(parts) == 2 and not gated) or act not in table:
        raise unsupported("feed_forward_proj", proj, ", ".join([*ACTIVATIONS_IN, *(f"gated-{a}" for a in GATED_IN)]))
    return table[act]


def _tied(hf: dict[str, Any], names: set[str]) -> bool:
    """Whether the head is the shared embedding.

    transformers ≥ 5 saves ``scale_decoder_outputs`` and ties the head unless the checkpoint holds an
    ``lm_head.weight`` of its own; before, ``tie_word_embeddings`` (default true) decided, whatever the file held.
    """
    if "lm_head.weight" not in names:
        return True
    return "scale_decoder_outputs" not in hf and bool(field(hf, "tie_word_embeddings", True))


def to_config(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    expect(hf, "is_encoder_decoder", True, default=True)
    expect(hf, "is_decoder", False, default=False)
    buckets = field(hf, "relative_attention_num_buckets", 32)
    distance = field(hf, "relative_attention_max_distance", 128)
    if buckets < 4:
        raise unsupported("relative_attention_num_buckets", buckets, "at least 4")
    if distance <= buckets // 2:
        raise unsupported("relative_attention_max_distance", distance,
                          f"above half of relative_attention_num_buckets ({buckets})")
    layers = field(hf, "num_layers")
    scale = hf.get("scale_decoder_outputs")
    if scale is None:  # transformers < 5: the rescale came with the tied head
        scale = field(hf, "tie_word_embeddings", True) is not False
    return ModelConfig(
        family="encoder_decoder", vocab_size=field(hf, "vocab_size"), d_model=field(hf, "d_model"),
        num_layers=field(hf, "num_decoder_layers", layers), num_encoder_layers=layers,
        num_heads=field(hf, "num_heads"), head_dim=field(hf, "d_kv"), d_ff=field(hf, "d_ff"),
        max_seq_len=field(hf, "n_positions", DEFAULT_MAX_SEQ_LEN), activation=_activation(hf), norm="rmsnorm",
        norm_position="pre", norm_eps=float(field(hf, "layer_norm_epsilon", 1e-6)), position="relative_bias",
        relative_attention_num_buckets=buckets, relative_attention_max_distance=distance, attention_scale=1.0,
        use_bias=False, tie_embeddings=_tied(hf, names), scale_head_inputs=bool(scale),
    )


def check_export(cfg: ModelConfig) -> None:
    common_requirements(cfg, "T5")
    requires(cfg, "T5", family="encoder_decoder", position="relative_bias", norm="rmsnorm", norm_position="pre",
             use_bias=False, qkv_bias=(None, False), num_kv_heads=cfg.num_heads, attention_scale=1.0,
             activation=tuple(FEED_FORWARD_OUT), logit_bias=False, scale_embeddings=False, embedding_norm=False,
             num_token_types=0, sliding_window=None)


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "model_type": "t5", "architectures": [ARCHITECTURE], "vocab_size": cfg.vocab_size, "d_model": cfg.d_model,
        "d_kv": cfg.head_dim, "d_ff": cfg.d_ff, "num_layers": cfg.num_encoder_layers,
        "num_decoder_layers": cfg.num_layers, "num_heads": cfg.num_heads,
        "relative_attention_num_buckets": cfg.relative_attention_num_buckets,
        "relative_attention_max_distance": cfg.relative_attention_max_distance, "layer_norm_epsilon": cfg.norm_eps,
        "feed_forward_proj": FEED_FORWARD_OUT[cfg.activation], "tie_word_embeddings": cfg.tie_embeddings,
        "scale_decoder_outputs": cfg.scale_head_inputs, "n_positions": cfg.max_seq_len, "dropout_rate": 0.0,
        "is_encoder_decoder": True,
    }


def _attention(hf: str, ours: str, cfg: ModelConfig) -> list[Rule]:
    E, H, D = cfg.d_model, cfg.num_heads, cfg.head_dim
    return [linear(f"{hf}.q.weight", f"{ours}.wq", (E,), (H, D)), linear(f"{hf}.k.weight", f"{ours}.wk", (E,), (H, D)),
            linear(f"{hf}.v.weight", f"{ours}.wv", (E,), (H, D)), linear(f"{hf}.o.weight", f"{ours}.wo", (H, D), (E,))]


def _feed_forward(hf: str, ours: str, cfg: ModelConfig) -> list[Rule]:
    E, F = cfg.d_model, cfg.d_ff
    out = [linear(f"{hf}.wo.weight", f"{ours}.w_out", (F,), (E,))]
    if not cfg.is_gated:
        return [linear(f"{hf}.wi.weight", f"{ours}.w_in", (E,), (F,)), *out]
    # T5DenseGatedActDense: act(wi_0 x) ⊙ wi_1 x
    return [linear(f"{hf}.wi_0.weight", f"{ours}.w_gate", (E,), (F,)),
            linear(f"{hf}.wi_1.weight", f"{ours}.w_in", (E,), (F,)), *out]


def rules(cfg: ModelConfig) -> list[Rule]:
    V, E, H, P = cfg.vocab_size, cfg.d_model, cfg.num_heads, cfg.relative_attention_num_buckets
    out = [same("shared.weight", "embedding.tokens", (V, E))]
    for stack, layers in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_layers)):
        out.append(same(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                        f"{stack}.relative_bias", (P, H)))
        for i in range(layers):
            hf, ours = f"{stack}.block.{i}", f"{stack}.blocks.{i}"
            out += norm_rules(f"{hf}.layer.0.layer_norm", f"{ours}.attention_norms.0", cfg)
            out += _attention(f"{hf}.layer.0.SelfAttention", f"{ours}.attention", cfg)
            feed_forward = 1
            if stack == "decoder":
                out += norm_rules(f"{hf}.layer.1.layer_norm", f"{ours}.cross_attention_norms.0", cfg)
                out += _attention(f"{hf}.layer.1.EncDecAttention", f"{ours}.cross_attention", cfg)
                feed_forward = 2
            out += norm_rules(f"{hf}.layer.{feed_forward}.layer_norm", f"{ours}.feed_forward_norms.0", cfg)
            out += _feed_forward(f"{hf}.layer.{feed_forward}.DenseReluDense", f"{ours}.feed_forward", cfg)
        out += norm_rules(f"{stack}.final_layer_norm", f"{stack}.final_norm", cfg)
    if not cfg.tie_embeddings:
        out.append(linear("lm_head.weight", "head.w", (E,), (V,)))
    return out
