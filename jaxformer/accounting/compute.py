"""FLOPs, KV-cache bytes and attention's share of the arithmetic.

Conventions: one multiply–accumulate is 2 FLOPs. A token's forward pass multiplies
every weight of every matrix it passes through once (embedding *lookups* are free, the
output head is not) and, per self-attention layer, forms scores against ``seq_len``
keys and mixes ``seq_len`` values: ``2 · 2 · seq_len · H·Dh`` FLOPs — the full context
(a causal layer's sliding window bounds it), the logits and reduce terms of Hoffmann et al.
(2022, Appendix F), whose softmax is left out as elementwise work. Backward costs twice the
forward, so training costs ``3 ×`` forward per token; ``6·N·D`` is the usual approximation of that.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from jaxformer.accounting.params import count_params
from jaxformer.architecture import ModelConfig
from jaxformer.checks import require_positive


def _attention_matmul_weights(cfg: ModelConfig) -> int:
    q_width, kv_width = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return 2 * cfg.d_model * q_width + 2 * cfg.d_model * kv_width


def _ffn_matmul_weights(cfg: ModelConfig) -> int:
    """Weights one token multiplies in the FFN sublayer (active experts and router only).

    MoE: the ``k`` routed experts of every token, as if none were dropped; the expert
    buffer's empty rows (``X·C`` rows in training, ``X·T`` at inference, which drops
    nothing; `jaxformer.functional.moe`) are not counted.
    """
    matrices = 3 if cfg.is_gated else 2
    if not cfg.is_moe:
        return matrices * cfg.d_model * cfg.d_ff
    experts = cfg.experts_per_token + cfg.num_shared_experts
    return experts * matrices * cfg.d_model * cfg.expert_d_ff + cfg.d_model * cfg.num_experts


def layer_matmul_weights(cfg: ModelConfig) -> int:
    """Matrix weights one token multiplies in one (self-attention + FFN) layer."""
    return _attention_matmul_weights(cfg) + _ffn_matmul_weights(cfg)


def attention_flops_per_token(cfg: ModelConfig, seq_len: int, *, causal: bool = True) -> int:
    """Scores and value mixing of one token in one self-attention layer, in FLOPs; the sliding window applies to
    causal layers only, as in `jaxformer.nn.attention` (an encoder's layers see the whole sequence)."""
    context = min(seq_len, cfg.sliding_window) if cfg.sliding_window and causal else seq_len
    return 4 * context * cfg.num_heads * cfg.head_dim


@dataclasses.dataclass(frozen=True)
class ForwardFlops:
    """Forward FLOPs per token at a sequence length: ``matmul + attention = total``."""

    matmul: int
    attention: int

    @property
    def total(self) -> int:
        return self.matmul + self.attention


def forward_flops_per_token(cfg: ModelConfig, seq_len: int) -> ForwardFlops:
    """Exact forward FLOPs per token (decoder tokens; encoder stacks at the same length)."""
    require_positive("seq_len/tokens", seq_len)
    self_attention_layers = cfg.num_layers + cfg.num_encoder_layers
    causal_layers = 0 if cfg.family == "encoder" else cfg.num_layers
    matmul = self_attention_layers * layer_matmul_weights(cfg)
    attention = (causal_layers * attention_flops_per_token(cfg, seq_len)
                 + (self_attention_layers - causal_layers) * attention_flops_per_token(cfg, seq_len, causal=False))
    if cfg.family == "encoder_decoder":  # cross-attention: projections and attention over the source
        matmul += cfg.num_layers * _attention_matmul_weights(cfg)
        attention += cfg.num_layers * 4 * seq_len * cfg.num_heads * cfg.head_dim
    if cfg.family == "encoder" and not cfg.mlm_head:  # a bare encoder ends at its hidden states
        return ForwardFlops(matmul=2 * matmul, attention=attention)
    if cfg.family == "encoder":
        matmul += cfg.d_model * cfg.d_model  # masked-LM transform
    matmul += cfg.d_model * cfg.vocab_size  # output head, tied or not
    # BERT's pooler runs once per sequence, not per token: not counted here
    return ForwardFlops(matmul=2 * matmul, attention=attention)


FlopsRule = Literal["6ND", "6ND_non_embedding", "exact"]
"""How training FLOPs per token are counted: ``6·N`` with N the active parameters (all of
them, or those outside the embeddings), or ``3 ×`` the exact forward count."""


def training_flops_per_token(cfg: ModelConfig, seq_len: int, rule: FlopsRule = "exact") -> float:
    """Training FLOPs per token under ``rule`` — the one count the loop, the planner and the benchmark use."""
    if rule == "exact":
        return 3.0 * forward_flops_per_token(cfg, seq_len).total
    params = count_params(cfg)
    if rule == "6ND":
        return 6.0 * params.active
    if rule == "6ND_non_embedding":
        return 6.0 * params.active_non_embedding
    raise ValueError(f"rule must be one of {typing.get_args(FlopsRule)}, got {rule!r}")


def training_flops(cfg: ModelConfig, tokens: float, seq_len: int) -> dict[str, float]:
    """Training compute for ``tokens`` tokens under every `FlopsRule` (``6·N·D``, N = active params, and exact)."""
    return {rule: training_flops_per_token(cfg, seq_len, rule) * tokens for rule in typing.get_args(FlopsRule)}


def kv_cache_bytes(cfg: ModelConfig, tokens: int, *, batch: int = 1, bytes_per_value: int = 2,
                   source_tokens: int | None = None) -> int:
    """Bytes of the keys and values a decode holds: ``2 · layers · kv_heads · head_dim · tokens · bytes · batch``
    for the self-attention of every decoder layer (`jaxformer.models.KVCache`; a sliding window bounds the cached
    tokens at the window), and for an encoder–decoder as much again over ``source_tokens`` (default ``tokens``): the
    cross-attention K and V of the encoded source, computed once per decode (`jaxformer.models.generate`). 0 for an
    encoder, which does not decode.
    """
    require_positive("seq_len/tokens", tokens)
    if source_tokens is not None:
        require_positive("source_tokens", source_tokens)
    if cfg.family == "encoder":
        return 0
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * bytes_per_value * batch
    cached = min(tokens, cfg.sliding_window) if cfg.sliding_window else tokens
    if cfg.family == "encoder_decoder":
        cached += tokens if source_tokens is None else source_tokens
    return per_token * cached


def attention_flop_share(cfg: ModelConfig, seq_len: int) -> float:
    """Attention's fraction of one layer's forward FLOPs (embeddings and head excluded; an encoder's layer, which
    no window bounds, for the encoder family)."""
    attention = attention_flops_per_token(cfg, seq_len, causal=cfg.family != "encoder")
    return attention / (2 * layer_matmul_weights(cfg) + attention)


def attention_crossover_length(cfg: ModelConfig) -> float:
    """Sequence length at which attention's FLOPs equal the layer's matmul FLOPs (6d for GPT shapes)."""
    return 2 * layer_matmul_weights(cfg) / (4 * cfg.num_heads * cfg.head_dim)


__all__ = [
    "FlopsRule",
    "ForwardFlops",
    "attention_crossover_length",
    "attention_flop_share",
    "forward_flops_per_token",
    "kv_cache_bytes",
    "layer_matmul_weights",
    "training_flops",
    "training_flops_per_token",
]
