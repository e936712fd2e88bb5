"""``jaxformer bench decode``: per-token latency with and without the KV cache, side by side in one run.

With the cache, each of ``--tokens`` greedy steps (``jaxformer.models.generate.decode_step``:
one token through the model against the cache, then the argmax) is timed on its own.
Without it, producing token ``t`` means running the whole sequence so far (prompt +
``t`` tokens) through the model; that is timed at t = 1, 2, 4, … ``--tokens`` (one
compiled program per length, median of ``--repeats`` calls). The speedup at token ``t``
is the ratio of the two. The cache's measured bytes are compared with
``jaxformer.accounting.kv_cache_bytes``.

Writes ``decode.json`` and the log-log plot ``decode.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.arguments import integer
from jaxformer.benchmarks.environment import environment
from jaxformer.benchmarks.figures import save_figure
from jaxformer.benchmarks.outputs import output_directory
from jaxformer.files import write_atomically


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML file with a model section (or a bare model mapping)")
    parser.add_argument("--preset", help="a named preset (default: gpt2 when no config is given)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/decode"), help="directory for JSON and PNG")
    parser.add_argument("--tokens", type=int, default=512, help="tokens generated after the prompt")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=integer(1), default=3, help="timed calls per length without the cache (median)")
    parser.add_argument("--window", type=int, default=16, help="cached steps around token t whose median is reported")
    parser.add_argument("--seed", type=int, default=0)


def _model_config(args):
    from jaxformer.models.presets import resolve_model

    cfg = resolve_model(args.config, args.preset or (None if args.config else "gpt2"))
    needed = args.prompt_len + args.tokens
    if cfg.family != "decoder":
        raise ValueError(f"bench decode needs a decoder model, got model.family {cfg.family!r}")
    if needed > cfg.max_seq_len:
        print(f"note: raising model.max_seq_len from {cfg.max_seq_len} to {needed} (prompt + tokens)")
        cfg = dataclasses.replace(cfg, max_seq_len=needed)
    return cfg


def timed(fn, *args):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start


def cached_latencies(graphdef, state, prompt_BT, cfg, tokens: int):
    """Seconds for each of ``tokens`` decode steps, and the cache they filled."""
    from jaxformer.models.generate import decode_step
    from jaxformer.models.kv_cache import KVCache

    batch, prompt_len = prompt_BT.shape
    key = jax.random.key(0)
    advance = decode_step(graphdef, temperature=0.0)
    make_cache = lambda: KVCache.create(cfg, batch, prompt_len + tokens)  # noqa: E731
    # compile prefill and step once, outside the timings
    token_B1, cache = advance(state, prompt_BT, make_cache(), key, 0)
    jax.block_until_ready(advance(state, token_B1, cache, key, 0))
    token_B1, cache = jax.block_until_ready(advance(state, prompt_BT, make_cache(), key, 0))
    seconds = []
    for step in range(1, tokens + 1):
        (token_B1, cache), step_s = timed(lambda t, c: advance(state, t, c, key, step), token_B1, cache)
        seconds.append(step_s)
    return seconds, cache


def uncached_latencies(graphdef, state, prompt_BT, points: list[int], repeats: int) -> dict[int, float]:
    """Median seconds to produce token ``t`` by running prompt + ``t`` tokens through the model."""
    from flax import nnx

    @jax.jit
    def next_token(state, tokens_BT):
        logits_BTV, _ = nnx.merge(graphdef, state)(tokens_BT)
        return jnp.argmax(logits_BTV[:, -1], axis=-1)

    medians = {}
    for t in points:
        tokens_BT = jnp.concatenate([prompt_BT, jnp.ones((prompt_BT.shape[0], t), jnp.int32)], axis=1)
        jax.block_until_ready(next_token(state, tokens_BT))  # compile
        medians[t] = statistics.median(timed(next_token, state, tokens_BT)[1] for _ in range(repeats))
        print(f"  without cache: t = {t}", flush=True)
    return medians


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.8))
    steps = np.arange(1, len(report["cached_s"]) + 1)
    ax.loglog(steps, np.asarray(report["cached_s"]) * 1e3, lw=0.8, label="with KV cache (every step)")
    ax.loglog(report["points"], [r["cached_ms"] for r in report["rows"]], "o", color="C0")
    ax.loglog(report["points"], [r["uncached_ms"] for r in report["rows"]], "o-", color="C1",
              label="without cache (recompute prompt + t tokens)")
    ax.set(xlabel="generated token t", ylabel="latency of token t (ms)",
           title=f"{report['model']}: decode latency, batch {report['batch']}, prompt {report['prompt_len']}")
    save_figure(fig, (ax,), path)


def run(args: argparse.Namespace) -> int:
    from flax import nnx

    from jaxformer.accounting import count_params, kv_cache_bytes
    from jaxformer.models.build import build_model

    for name in ("tokens", "prompt_len", "batch", "repeats", "window"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    cfg = _model_config(args)
    out = output_directory(args.out, "--out")
    model_name = args.preset or (args.config if args.config else "gpt2")
    graphdef, state = nnx.split(build_model(cfg, rngs=nnx.Rngs(params=args.seed)))
    prompt_BT = jax.random.randint(jax.random.key(args.seed), (args.batch, args.prompt_len), 0, cfg.vocab_size)
    machine = {**environment(), "device": str(jax.devices()[0])}
    print(f"jaxformer bench decode: {model_name} ({count_params(cfg).total:,} parameters) on {machine['device']}, "
          f"{machine['cpu_model']}, "
          f"batch {args.batch}, prompt {args.prompt_len}, {args.tokens} tokens", flush=True)

    cached_s, cache = cached_latencies(graphdef, state, prompt_BT, cfg, args.tokens)
    points = sorted({*(2**i for i in range(int(np.log2(args.tokens)) + 1)), args.tokens})
    uncached = uncached_latencies(graphdef, state, prompt_BT, points, args.repeats)

    rows = []
    for t in points:  # median of the cached steps in a window ending at t (one step is noisy)
        window = cached_s[max(0, t - args.window):t]
        cached_ms = statistics.median(window) * 1e3
        rows.append({"t": t, "uncached_ms": uncached[t] * 1e3, "cached_ms": cached_ms,
                     "speedup": uncached[t] * 1e3 / cached_ms})
    itemsize = jnp.dtype(cache.keys[0].dtype).itemsize
    positions = args.prompt_len + args.tokens
    formula = kv_cache_bytes(cfg, positions, batch=args.batch, bytes_per_value=itemsize)
    print(f"\n{'token t':>8} | {'no cache ms':>12} | {'KV cache ms':>12} | {'speedup':>8}")
    print("-" * 50)
    for r in rows:
        print(f"{r['t']:>8} | {r['uncached_ms']:>12.3f} | {r['cached_ms']:>12.3f} | {r['speedup']:>7.1f}x")
    last = rows[-1]
    print(f"speedup at token {last['t']}: {last['speedup']:.1f}x")
    print(f"KV cache: {cache.nbytes:,} bytes measured for {positions} positions in {cache.slots} slots "
          f"({cache.keys[0].dtype}); formula kv_cache_bytes = {formula:,} "
          f"({'equal' if cache.nbytes == formula else f'ratio {cache.nbytes / formula:.3f}'})")
    report = {
        "model": model_name, "config": dataclasses.asdict(cfg), "batch": args.batch, "prompt_len": args.prompt_len,
        "tokens": args.tokens, "points": points, "rows": rows, "cached_s": cached_s,
        "speedup_at_last_token": last["speedup"], "cache_bytes": cache.nbytes, "cache_bytes_formula": formula,
        "machine": machine,
    }
    write_atomically(out / "decode.json", lambda handle: handle.write(json.dumps(report, indent=1).encode()))
    plot(report, out / "decode.png")
    print(f"\nwrote {out / 'decode.json'} and {out / 'decode.png'}")
    return 0
