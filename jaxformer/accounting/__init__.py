"""Exact accounting from a `ModelConfig`: parameters, FLOPs, KV-cache bytes."""

from jaxformer.accounting.compute import (
    FlopsRule,
    ForwardFlops,
    attention_crossover_length,
    attention_flop_share,
    forward_flops_per_token,
    kv_cache_bytes,
    training_flops,
    training_flops_per_token,
)
from jaxformer.accounting.params import ParamCount, count_params

__all__ = [
    "FlopsRule",
    "ForwardFlops",
    "ParamCount",
    "attention_crossover_length",
    "attention_flop_share",
    "count_params",
    "forward_flops_per_token",
    "kv_cache_bytes",
    "training_flops",
    "training_flops_per_token",
]
