"""Exact parameter counts of a `ModelConfig`, component by component.

The counts mirror the modules in ``jaxformer.nn`` one for one (a test builds every
family and compares), so they are exact, not estimates: biases, norms, tied heads,
GQA's narrower K/V projections, SwiGLU's third matrix and every MoE expert included.
"""

from __future__ import annotations

import dataclasses

from jaxformer.architecture import ModelConfig


@dataclasses.dataclass(frozen=True)
class ParamCount:
    """Parameter counts (numbers of scalars).

    total: everything the model holds.
    non_embedding: total less the token, position and token-type embedding tables and T5's
      relative-position bias tables (Kaplan et al.'s N; an untied output head, the embedding
      norm and a logit bias count as non-embedding).
    active: parameters used for one token (MoE: only ``experts_per_token`` routed experts).
    breakdown: component -> count over the whole model (sums to ``total``).
    per_layer: component -> count for one layer of each stack (``encoder.*``/``decoder.*``).
    """

    total: int
    non_embedding: int
    active: int
    active_non_embedding: int
    breakdown: dict[str, int]
    per_layer: dict[str, int]


def norm_params(cfg: ModelConfig) -> int:
    """One norm: scale (+ shift for LayerNorm)."""
    return 2 * cfg.d_model if cfg.norm == "layernorm" else cfg.d_model


def attention_params(cfg: ModelConfig) -> int:
    """W_Q (d × H·Dh), W_K and W_V (d × K·Dh each), W_O (H·Dh × d), plus biases.

    Query/key/value biases follow ``cfg.has_qkv_bias`` (Qwen2 has them without ``use_bias``),
    the output projection's ``cfg.use_bias``.
    """
    q_width = cfg.num_heads * cfg.head_dim
    kv_width = cfg.num_kv_heads * cfg.head_dim
    weights = cfg.d_model * q_width + 2 * cfg.d_model * kv_width + q_width * cfg.d_model
    biases = (q_width + 2 * kv_width if cfg.has_qkv_bias else 0) + (cfg.d_model if cfg.use_bias else 0)
    return weights + biases


def ffn_params(cfg: ModelConfig, d_ff: int) -> int:
    """Two matrices (three for SwiGLU) between d and ``d_ff``, plus biases."""
    matrices = 3 if cfg.is_gated else 2
    weights = matrices * cfg.d_model * d_ff
    biases = (matrices - 1) * d_ff + cfg.d_model if cfg.use_bias else 0
    return weights + biases


def router_params(cfg: ModelConfig) -> int:
    """An MoE layer's router: one ``[E, X]`` matrix (X experts), no bias."""
    return cfg.d_model * cfg.num_experts


def feed_forward_params(cfg: ModelConfig, *, active: bool = False) -> int:
    """The FFN sublayer of one layer: dense, or routed plus shared experts (router excluded)."""
    if not cfg.is_moe:
        return ffn_params(cfg, cfg.d_ff)
    routed = cfg.experts_per_token if active else cfg.num_experts
    return (routed + cfg.num_shared_experts) * ffn_params(cfg, cfg.expert_d_ff)


def norms_per_sublayer(cfg: ModelConfig) -> int:
    return 2 if cfg.norm_position == "sandwich" else 1


def layer_params(cfg: ModelConfig, *, cross_attention: bool, active: bool = False) -> dict[str, int]:
    """Components of one block; a decoder block of an encoder–decoder adds cross-attention."""
    sublayers = 3 if cross_attention else 2
    parts = {
        "attention": attention_params(cfg),
        "feed_forward": feed_forward_params(cfg, active=active),
        "norms": sublayers * norms_per_sublayer(cfg) * norm_params(cfg),
    }
    if cfg.is_moe:
        parts["router"] = router_params(cfg)
    if cross_attention:
        parts["cross_attention"] = attention_params(cfg)
    return parts


def count_params(cfg: ModelConfig) -> ParamCount:
    """Exact parameter counts of the model ``cfg`` describes."""
    decoder_layers = cfg.num_layers
    stacks = {"decoder" if cfg.family != "encoder" else "encoder": (decoder_layers, cfg.family == "encoder_decoder")}
    if cfg.family == "encoder_decoder":
        stacks = {"encoder": (cfg.num_encoder_layers, False), "decoder": (decoder_layers, True)}

    def model_total(active: bool) -> tuple[dict[str, int], dict[str, int]]:
        breakdown: dict[str, int] = {
            "token_embedding": cfg.vocab_size * cfg.d_model,
            "position_embedding": cfg.max_seq_len * cfg.d_model if cfg.position == "learned" else 0,
            "token_type_embedding": cfg.num_token_types * cfg.d_model,
            "embedding_norm": norm_params(cfg) if cfg.embedding_norm else 0,
            # T5: one [buckets, heads] table per stack, shared by its layers
            "relative_bias": (len(stacks) * cfg.relative_attention_num_buckets * cfg.num_heads
                              if cfg.position == "relative_bias" else 0),
        }
        per_layer: dict[str, int] = {}
        for stack, (layers, cross) in stacks.items():
            parts = layer_params(cfg, cross_attention=cross, active=active)
            for name, value in parts.items():
                per_layer[f"{stack}.{name}"] = value
                breakdown[name] = breakdown.get(name, 0) + layers * value
            per_layer[f"{stack}.total"] = sum(parts.values())
        final_norms = len(stacks) if cfg.has_final_norm else 0
        breakdown["norms"] += final_norms * norm_params(cfg)
        has_head = cfg.family != "encoder" or cfg.mlm_head
        if cfg.family == "encoder" and cfg.mlm_head:
            # BERT's masked-LM transform: dense d×d (+bias), activation, norm, then the vocabulary
            breakdown["mlm_head"] = cfg.d_model * cfg.d_model + norm_params(cfg) + (
                cfg.d_model + cfg.vocab_size if cfg.use_bias else 0
            )
        if cfg.pooler:  # BERT's pooler: dense d×d + bias, tanh, on the first token
            breakdown["pooler"] = cfg.d_model * cfg.d_model + cfg.d_model
        breakdown["output_head"] = 0 if cfg.tie_embeddings or not has_head else cfg.d_model * cfg.vocab_size
        breakdown["logit_bias"] = cfg.vocab_size if cfg.logit_bias else 0
        return breakdown, per_layer

    breakdown, per_layer = model_total(active=False)
    active_breakdown, _ = model_total(active=True)
    embedding = sum(breakdown[name] for name in ("token_embedding", "position_embedding", "token_type_embedding",
                                                 "relative_bias"))
    total, active = sum(breakdown.values()), sum(active_breakdown.values())
    return ParamCount(
        total=total,
        non_embedding=total - embedding,
        active=active,
        active_non_embedding=active - embedding,
        breakdown=breakdown,
        per_layer=per_layer,
    )
