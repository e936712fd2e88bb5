"""`jaxformer count`: exact parameter, FLOP and KV-cache accounting of a preset or a config file."""

from __future__ import annotations

import argparse
import json

from jaxformer.arguments import integer, number
from jaxformer.accounting.compute import (
    attention_crossover_length,
    attention_flop_share,
    forward_flops_per_token,
    kv_cache_bytes,
    training_flops,
)
from jaxformer.accounting.params import count_params
from jaxformer.architecture import ModelConfig, check_context
from jaxformer.models.presets import resolve_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML file with a model section (or a bare model mapping)")
    parser.add_argument("--preset", help="a named preset, e.g. gpt2, llama2-7b, moe-8x-top2")
    parser.add_argument("--seq-len", type=integer(1), help="sequence length for FLOPs and KV cache (default: max_seq_len)")
    parser.add_argument("--tokens", type=number(above=0), help="training tokens D for the training-FLOP estimate")
    parser.add_argument("--bytes-per-value", type=integer(1), default=2, help="KV-cache bytes per value (2 = fp16/bf16)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def report(cfg: ModelConfig, seq_len: int, tokens: float | None, bytes_per_value: int) -> dict:
    params = count_params(cfg)
    forward = forward_flops_per_token(cfg, seq_len)
    result = {
        "params": params.total,
        "params_non_embedding": params.non_embedding,
        "params_active": params.active,
        "params_breakdown": params.breakdown,
        "params_per_layer": params.per_layer,
        "seq_len": seq_len,
        "forward_flops_per_token": {"matmul": forward.matmul, "attention": forward.attention, "total": forward.total},
        "attention_flop_share": attention_flop_share(cfg, seq_len),
        "attention_crossover_length": attention_crossover_length(cfg),
        "kv_cache_bytes": kv_cache_bytes(cfg, seq_len, bytes_per_value=bytes_per_value),
    }
    if tokens is not None:
        if tokens <= 0:
            raise ValueError(f"--tokens must be positive, got {tokens}")
        result["training_flops"] = training_flops(cfg, tokens, seq_len)
    return result


def run(args: argparse.Namespace) -> int:
    cfg = resolve_model(args.config, args.preset)
    seq_len = cfg.max_seq_len if args.seq_len is None else args.seq_len
    if cfg.position == "learned":  # no position past the table: other schemes are counted at any length
        check_context(cfg, seq_len, what="--seq-len")
    result = report(cfg, seq_len, args.tokens, args.bytes_per_value)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"parameters          {result['params']:>18,}")
    print(f"  non-embedding     {result['params_non_embedding']:>18,}")
    if cfg.is_moe:
        print(f"  active per token  {result['params_active']:>18,}")
    for name, value in result["params_breakdown"].items():
        if value:
            print(f"  {name:<18}{value:>18,}")
    flops = result["forward_flops_per_token"]
    print(f"forward FLOPs/token {flops['total']:>18,.4g}  at seq_len {seq_len} "
          f"(matmul {flops['matmul']:.4g}, attention {flops['attention']:.4g})")
    print(f"attention share     {result['attention_flop_share']:>18.1%}  "
          f"(crossover at {result['attention_crossover_length']:,.0f} tokens)")
    if cfg.family != "encoder":  # an encoder does not decode: it holds no cache
        source = f" (and {seq_len} source tokens)" if cfg.family == "encoder_decoder" else ""
        print(f"KV cache            {result['kv_cache_bytes'] / 1e9:>15.3f} GB  for {seq_len} tokens{source} "
              f"at {args.bytes_per_value} bytes/value")
    if "training_flops" in result:
        train = result["training_flops"]
        print(f"training FLOPs      {train['exact']:>18.4g}  exact; 6ND = {train['6ND']:.4g}")
    return 0
