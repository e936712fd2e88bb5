"""BERT and its relatives with BERT's layout (MiniLM, sentence-transformers encoders): ``model_type: bert``.

Post-LayerNorm encoder with learned positions, token types and the embedding LayerNorm; the
masked-LM head (``BertForMaskedLM``) and the pooler are imported when the checkpoint has them.
"""

from __future__ import annotations

from typing import Any

from jaxformer.architecture import ModelConfig
from jaxformer.hf.families.common import (ACTIVATIONS_OUT, activation_in, common_requirements, expect, field,
                                          norm_rules, requires)
from jaxformer.hf.layout import Rule, copies, head_bias, linear, same

MODEL_TYPES = ("bert",)
PREFIX = "bert."  # BertModel checkpoints (sentence-transformers') have no prefix
TIED = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",  # what transformers ties when
        "cls.predictions.decoder.bias": "cls.predictions.bias"}  # tie_word_embeddings
# buffers; the tied decoder (and its copy of the bias); the NSP head
IGNORED = (".position_ids", ".token_type_ids", "cls.seq_relationship.", *TIED)
# older checkpoints (TensorFlow ports) name LayerNorm parameters gamma/beta; before transformers 5 an untied
# head's decoder.bias was cls.predictions.bias itself (one tensor, saved under that name)
ALIASES = {".LayerNorm.weight": ".LayerNorm.gamma", ".LayerNorm.bias": ".LayerNorm.beta",
           "cls.predictions.decoder.bias": "cls.predictions.bias"}


def to_config(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    expect(hf, "position_embedding_type", "absolute", default="absolute")
    expect(hf, "is_decoder", False, default=False)
    has = lambda suffix: any(n.endswith(suffix) for n in names)  # noqa: E731
    return ModelConfig(
        family="encoder", vocab_size=field(hf, "vocab_size"), d_model=field(hf, "hidden_size"),
        num_layers=field(hf, "num_hidden_layers"), num_heads=field(hf, "num_attention_heads"),
        d_ff=field(hf, "intermediate_size"), max_seq_len=field(hf, "max_position_embeddings"),
        activation=activation_in(hf, "hidden_act"), norm="layernorm", norm_position="post",
        norm_eps=float(field(hf, "layer_norm_eps", 1e-12)), position="learned", use_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), embedding_norm=True,
        num_token_types=field(hf, "type_vocab_size", 2), mlm_head=has("cls.predictions.bias"),
        pooler=has("pooler.dense.weight"),
    )


def is_bare(cfg: ModelConfig) -> bool:
    """A ``BertModel`` export: its tensor names have no ``bert.`` prefix."""
    return not cfg.mlm_head


def architecture(cfg: ModelConfig) -> tuple[str, str]:
    """``(architectures entry, Auto class)`` of the export."""
    return ("BertForMaskedLM", "AutoModelForMaskedLM") if cfg.mlm_head else ("BertModel", "AutoModel")


def check_export(cfg: ModelConfig) -> None:
    common_requirements(cfg, "BERT")
    requires(cfg, "BERT", family="encoder", position="learned", norm="layernorm", norm_position="post",
             use_bias=True, qkv_bias=(None, True), num_kv_heads=cfg.num_heads, head_dim=cfg.d_model // cfg.num_heads,
             activation=tuple(ACTIVATIONS_OUT), embedding_norm=True, scale_embeddings=False, attention_scale=None)
    if cfg.num_token_types == 0:
        raise ValueError("model.num_token_types=0 has no Hugging Face BERT equivalent (BERT has a token-type table)")


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "model_type": "bert", "architectures": [architecture(cfg)[0]], "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.d_ff, "hidden_act": ACTIVATIONS_OUT[cfg.activation],
        "max_position_embeddings": cfg.max_seq_len, "type_vocab_size": cfg.num_token_types,
        "layer_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
        "position_embedding_type": "absolute", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    }


def rules(cfg: ModelConfig) -> list[Rule]:
    E, H, D, F, V = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size
    out = [same("bert.embeddings.word_embeddings.weight", "embedding.tokens", (V, E)),
           same("bert.embeddings.position_embeddings.weight", "embedding.positions", (cfg.max_seq_len, E)),
           same("bert.embeddings.token_type_embeddings.weight", "embedding.token_types", (cfg.num_token_types, E))]
    out += norm_rules("bert.embeddings.LayerNorm", "embedding.norm", cfg)
    for i in range(cfg.num_layers):
        hf, ours = f"bert.encoder.layer.{i}", f"encoder.blocks.{i}"
        attention, mlp = f"{ours}.attention", f"{ours}.feed_forward"
        for name, w, b in (("query", "wq", "bq"), ("key", "wk", "bk"), ("value", "wv", "bv")):
            out += [linear(f"{hf}.attention.self.{name}.weight", f"{attention}.{w}", (E,), (H, D)),
                    head_bias(f"{hf}.attention.self.{name}.bias", f"{attention}.{b}", H, D)]
        out += [linear(f"{hf}.attention.output.dense.weight", f"{attention}.wo", (H, D), (E,)),
                same(f"{hf}.attention.output.dense.bias", f"{attention}.bo", (E,))]
        out += norm_rules(f"{hf}.attention.output.LayerNorm", f"{ours}.attention_norms.0", cfg)
        out += [linear(f"{hf}.intermediate.dense.weight", f"{mlp}.w_in", (E,), (F,)),
                same(f"{hf}.intermediate.dense.bias", f"{mlp}.b_in", (F,)),
                linear(f"{hf}.output.dense.weight", f"{mlp}.w_out", (F,), (E,)),
                same(f"{hf}.output.dense.bias", f"{mlp}.b_out", (E,))]
        out += norm_rules(f"{hf}.output.LayerNorm", f"{ours}.feed_forward_norms.0", cfg)
    if cfg.pooler:
        out += [linear("bert.pooler.dense.weight", "pooler.w", (E,), (E,)),
                same("bert.pooler.dense.bias", "pooler.b", (E,))]
    if cfg.mlm_head:
        out += [linear("cls.predictions.transform.dense.weight", "head.transform", (E,), (E,)),
                same("cls.predictions.transform.dense.bias", "head.transform_bias", (E,)),
                same("cls.predictions.bias", "head.output_bias", (V,)) if cfg.tie_embeddings else
                # untied, transformers ties no bias either: the head adds decoder.bias (read; both written)
                copies(("cls.predictions.decoder.bias", "cls.predictions.bias"), "head.output_bias", (V,))]
        out += norm_rules("cls.predictions.transform.LayerNorm", "head.norm", cfg)
        if not cfg.tie_embeddings:
            out.append(linear("cls.predictions.decoder.weight", "head.output.w", (E,), (V,)))
    return out
