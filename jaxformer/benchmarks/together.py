"""Runs trained together (`jaxformer.train.together`): R runs' steps as one vmapped program against R lone steps.

At each size, R states of the run's model step on their own random windows, side by side in one
process: *alone*, the run's compiled step called once per run (what R runs trained one after
another on one worker dispatch), and one call of the same step over the stacked states
(``make_train_step(stacked=...)``) both ways: ``vmap`` (batched) and ``map`` (``jax.lax.map``, in
turn inside one program). Alternating repeats, medians; each ratio is alone / that way's time per
round (one step of every run), so above 1 training together is faster. Compile times are
reported too: a group pays one compile of its stacked program where lone runs of a shape share one.

The mesh is the run's (`jaxformer.parallel.Layout`): in a process limited to one device
(``XLA_FLAGS=--xla_force_host_platform_device_count=1``, as a sweep's single-threaded worker
runs) it measures what `together: true` changes for such a worker.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.arguments import integer
from jaxformer.benchmarks.environment import environment
from jaxformer.benchmarks.outputs import output_file
from jaxformer.files import write_json_atomic

SIZES = ((16, 1, 32), (32, 2, 128), (64, 2, 128))
WAYS = ("vmap", "map")  # `jaxformer.train.step.over_runs`


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=",".join(f"{d}:{l}:{t}" for d, l, t in SIZES),
                        help="comma-separated d_model:layers:seq_len")
    parser.add_argument("--batch", type=integer(1), default=8, help="sequences per step of each run")
    parser.add_argument("--runs", default="2,4", help="comma-separated run counts R")
    parser.add_argument("--steps", type=integer(1), default=5, help="rounds per timed repeat")
    parser.add_argument("--repeats", type=integer(1), default=5, help="alternating repeats (medians reported)")
    parser.add_argument("--json", help="write the results to this JSON file")


def time_together(config, runs: int, *, steps: int = 5, repeats: int = 5) -> dict:
    """Seconds per round of ``runs`` runs of ``config``'s shape, alone and together (module docstring)."""
    from jaxformer.parallel import Layout
    from jaxformer.train.compiled import stacked_shardings
    from jaxformer.train.optimizer import make_optimizer
    from jaxformer.train.step import build_state, make_train_step
    from jaxformer.train.throughput import random_windows

    layout = Layout.for_run(config.parallel, config.model, config.micro_batch)
    optimizer = make_optimizer(config.optimizer)
    dtype, lr = config.train.compute_dtype, np.float32(config.optimizer.lr)
    graphdef, state = layout.materialize(lambda: build_state(config.model, config.train.seed, optimizer, config.kernel))
    windows = np.stack([random_windows(config, seed) for seed in range(runs)])  # [Y, A, B, W]
    batch_sharding = layout.batch_sharding(windows.shape[1:], batch_dim=1)
    stacked_sharding = layout.batch_sharding(windows.shape, batch_dim=2)
    state_sharding = stacked_shardings(layout, state)
    lone = make_train_step(graphdef, optimizer, dtype, state_sharding=layout.shardings(state),
                           batch_sharding=batch_sharding)
    lone_windows = [jax.device_put(w, batch_sharding) for w in windows]
    states = {"alone": [jax.tree.map(jnp.copy, state) for _ in range(runs)]}
    stacked_windows, lrs = jax.device_put(windows, stacked_sharding), np.full(runs, lr)
    programs = {way: make_train_step(graphdef, optimizer, dtype, state_sharding=state_sharding,
                                     batch_sharding=stacked_sharding, stacked=way) for way in WAYS}
    for way in WAYS:
        states[way] = jax.device_put(jax.tree.map(lambda x: jnp.stack([x] * runs), state), state_sharding)

    def one_round(way: str) -> None:
        if way == "alone":
            states["alone"] = [lone(s, w, lr) for s, w in zip(states["alone"], lone_windows)]
        else:
            states[way] = programs[way](states[way], stacked_windows, lrs)

    def seconds(way: str, count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            one_round(way)
        jax.block_until_ready(states[way])
        return time.perf_counter() - start

    compile_s = {way: seconds(way, 1) for way in ("alone", *WAYS)}  # the first calls compile
    timings = {way: [] for way in compile_s}
    for _ in range(repeats):
        for way in timings:
            timings[way].append(seconds(way, steps) / steps)
    round_s = {way: statistics.median(times) for way, times in timings.items()}
    return {"runs": runs, "devices": layout.mesh.devices.size, "round_s": round_s, "compile_s": compile_s,
            "ratio": {way: round_s["alone"] / round_s[way] for way in WAYS}}


def run(args: argparse.Namespace) -> int:
    from jaxformer.benchmarks.train import bench_config, parse_sizes

    sizes = parse_sizes(args.sizes)
    counts = [int(r) for r in args.runs.split(",") if r.isdigit()]
    if len(counts) != len(args.runs.split(",")) or any(r < 2 for r in counts):
        raise ValueError(f"--runs must list run counts of 2 or more, got {args.runs!r}")
    json_path = output_file(args.json, "--json")
    machine = environment()
    print(f"CPU: {machine['cpu_model']}, {machine['cores']} cores", flush=True)
    results = []
    print(f"{'d:L:T':>12}{'R':>4}{'dev':>5}{'alone ms':>10}{'vmap ms':>9}{'map ms':>9}{'vmap ×':>8}{'map ×':>7}"
          f"{'compile s alone/vmap/map':>27}")
    for d_model, layers, seq_len in sizes:
        config = bench_config(d_model, layers, seq_len, args.batch)
        for runs in counts:
            result = {"d_model": d_model, "layers": layers, "seq_len": seq_len, "batch": args.batch,
                      **time_together(config, runs, steps=args.steps, repeats=args.repeats)}
            results.append(result)
            columns = (("round_s", 1e3, 2), ("ratio", 1, 2), ("compile_s", 1, 1))
            ms, ratio, compile_s = ({k: f"{v * scale:.{digits}f}" for k, v in result[key].items()}
                                    for key, scale, digits in columns)
            print(f"{f'{d_model}:{layers}:{seq_len}':>12}{runs:>4}{result['devices']:>5}{ms['alone']:>10}"
                  f"{ms['vmap']:>9}{ms['map']:>9}{ratio['vmap']:>8}{ratio['map']:>7}"
                  f"{'/'.join(compile_s.values()):>27}", flush=True)
    if json_path is not None:
        write_json_atomic(json_path, {**machine, "results": results})
    print(json.dumps({"ratio": {f"{r['d_model']}:{r['runs']}": {way: round(x, 3) for way, x in r["ratio"].items()}
                                for r in results}}))
    return 0
