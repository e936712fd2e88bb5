"""``jaxformer bench attention``: naive vs blockwise vs XLA attention, side by side in one run.

1. Time: for n = min-n, 2·min-n … max-n (self-attention, batch 1, a few heads, d = 64, fp32),
   every implementation is compiled and warmed up, then timed ``repeats`` times, interleaved
   (repeat r runs every implementation before repeat r+1), so load on the machine hits all of
   them alike; the table shows medians, ratios to naive and local log-log slopes
   ``Δlog t / Δlog n``, plus an exponent fitted over n ≥ fit-min-n.
2. Memory: each (implementation, n) runs once in a fresh process
   (:mod:`jaxformer.benchmarks.attention_memory`): XLA's planned bytes and the measured rise of
   peak resident memory; n doubles until a probe is refused, naming what ran out (the memory
   budget or the time budget).

Writes ``attention.json`` and the log-log plot ``attention.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import numpy as np

from jaxformer.arguments import integer, number
from jaxformer.benchmarks.attention_memory import MODES, attention_call, largest_n
from jaxformer.benchmarks.environment import environment
from jaxformer.benchmarks.figures import save_figure
from jaxformer.benchmarks.outputs import output_directory
from jaxformer.files import write_atomically
from jaxformer.kernel import IMPLEMENTATIONS


def _names(text: str, allowed: tuple[str, ...], field: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    for name in names:
        if name not in allowed:
            raise ValueError(f"{field} must be a comma-separated subset of {','.join(allowed)}, got {name!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("runs/bench/attention"), help="directory for JSON and PNG")
    parser.add_argument("--min-n", type=integer(1), default=128, help="shortest sequence timed (tokens)")
    parser.add_argument("--max-n", type=integer(1), default=4096, help="largest n timed (n doubles from --min-n)")
    parser.add_argument("--repeats", type=integer(1), default=5, help="timed calls per implementation and n; medians reported")
    parser.add_argument("--warmup", type=integer(0), default=1, help="untimed calls after compiling")
    parser.add_argument("--impls", default=",".join(IMPLEMENTATIONS), help="timed implementations")
    parser.add_argument("--modes", default=",".join(MODES), help="forward and/or train (forward + gradients)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=128, help="keys per tile (blockwise)")
    parser.add_argument("--causal", action="store_true", help="causal mask (blockwise still visits every tile)")
    parser.add_argument("--fit-min-n", type=integer(1), default=1024, help="fit the exponent over n >= this")
    parser.add_argument("--memory-impls", default="naive,blockwise", help="'' skips the memory search")
    parser.add_argument("--memory-mode", choices=MODES, default="train")
    parser.add_argument("--memory-start-n", type=integer(1), default=1024, help="the memory search's first n (doubles)")
    parser.add_argument("--memory-max-n", type=integer(1), default=65536, help="the search stops here")
    parser.add_argument("--memory-budget-gb", type=number(above=0), default=None,
                        help="GiB one probe may use (default: half the memory available now)")
    parser.add_argument("--probe-time-s", type=number(above=0), default=120.0, help="time budget of one memory probe")
    parser.add_argument("--memory-total-s", type=number(above=0), default=900.0, help="time budget of each implementation's search")


def _available_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) * 1024


def sequence_lengths(min_n: int, max_n: int) -> list[int]:
    if not 0 < min_n <= max_n:
        raise ValueError(f"need 0 < --min-n <= --max-n, got {min_n} and {max_n}")
    return [min_n * 2**i for i in range(int(np.log2(max_n / min_n)) + 1)]


def time_attention(ns: list[int], impls: list[str], modes: list[str], *, repeats: int, warmup: int, shape: dict) -> list[dict]:
    """One row per (n, impl, mode): median, min and all wall times in seconds, and compile time."""
    rows = []
    for n in ns:
        compiled = {}
        for impl in impls:
            for mode in modes:
                fn, inputs = attention_call(impl, mode, n, **shape)
                start = time.perf_counter()
                executable = fn.lower(*inputs).compile()
                compile_s = time.perf_counter() - start
                for _ in range(warmup):
                    jax.block_until_ready(executable(*inputs))
                compiled[impl, mode] = (executable, inputs, compile_s, [])
        for _ in range(repeats):  # interleaved: each repeat runs every implementation once
            for executable, inputs, _, samples in compiled.values():
                start = time.perf_counter()
                jax.block_until_ready(executable(*inputs))
                samples.append(time.perf_counter() - start)
        for (impl, mode), (_, _, compile_s, samples) in compiled.items():
            rows.append({"n": n, "impl": impl, "mode": mode, "median_s": statistics.median(samples),
                         "min_s": min(samples), "samples_s": samples, "compile_s": compile_s})
        print(f"  timed n = {n}", flush=True)
    return rows


def slopes(rows: list[dict], *, fit_min_n: int) -> dict:
    """Per ``impl/mode``: local slopes between consecutive n, and the exponent fitted over n ≥ fit_min_n."""
    result = {}
    for impl, mode in dict.fromkeys((r["impl"], r["mode"]) for r in rows):
        points = sorted((r["n"], r["median_s"]) for r in rows if (r["impl"], r["mode"]) == (impl, mode))
        log_n, log_t = np.log([p[0] for p in points]), np.log([p[1] for p in points])
        local = list(np.diff(log_t) / np.diff(log_n))
        upper = log_n >= np.log(fit_min_n)
        fitted = float(np.polyfit(log_n[upper], log_t[upper], 1)[0]) if upper.sum() >= 2 else None
        result[f"{impl}/{mode}"] = {"n": [p[0] for p in points[1:]], "local": local, "fitted": fitted}
    return result


def timing_table(rows: list[dict], slope_fits: dict, impls: list[str], mode: str, fit_min_n: int) -> str:
    ns = sorted({r["n"] for r in rows})
    median = {(r["n"], r["impl"]): r["median_s"] for r in rows if r["mode"] == mode}
    ratios = [impl for impl in impls if impl != "naive" and "naive" in impls]
    header = f"{'n':>6} | " + " | ".join(f"{impl + ' ms [slope]':>24}" for impl in impls)
    header += "".join(f" | {impl + '/naive':>15}" for impl in ratios)
    lines = [header, "-" * len(header)]
    for index, n in enumerate(ns):
        cells = []
        for impl in impls:
            slope = "" if index == 0 else f"[{slope_fits[f'{impl}/{mode}']['local'][index - 1]:5.2f}]"
            cells.append(f"{median[n, impl] * 1e3:>16.3f} {slope:>7}")
        line = f"{n:>6} | " + " | ".join(cells)
        line += "".join(f" | {median[n, impl] / median[n, 'naive']:>15.2f}" for impl in ratios)
        lines.append(line)
    fitted = ", ".join(f"{impl} {slope_fits[f'{impl}/{mode}']['fitted']:.2f}" for impl in impls
                       if slope_fits[f"{impl}/{mode}"]["fitted"] is not None)
    lines.append(f"fitted exponent over n >= {fit_min_n}: {fitted or 'too few points'}")
    return "\n".join(lines)


def memory_table(searches: list[dict], shape: dict) -> str:
    mib = 2**20
    by_n: dict[int, dict] = {}
    for search in searches:
        for p in search["probes"]:  # a run's record wins over the same n's plan-only record
            by_n.setdefault(p["n"], {}).setdefault(search["impl"], p)
    impls = [s["impl"] for s in searches]
    header = f"{'n':>6} | {'scores MiB':>10} | " + " | ".join(f"{impl + ' plan/peak MiB, s':>34}" for impl in impls)
    lines = [header, "-" * len(header)]
    for n in sorted(by_n):
        score_mib = shape["batch"] * shape["heads"] * n * n * 4 / mib
        cells = []
        for impl in impls:
            p = by_n[n].get(impl)
            if p is None:
                cells.append(f"{'':>34}")
            elif p["status"] == "ok":
                cells.append(f"{p['planned_bytes'] / mib:>12.0f} {p['peak_added_bytes'] / mib:>12.0f} {p['seconds']:>8.2f}")
            elif p["status"] == "planned":
                cells.append(f"{p['planned_bytes'] / mib:>12.0f} {'(plan only)':>21}")
            else:
                cells.append(f"{'refused: ' + p['status']:>34}")
        lines.append(f"{n:>6} | {score_mib:>10.0f} | " + " | ".join(cells))
    for s in searches:
        line = f"{s['impl']}: largest n = {s['largest_n']}; stopped by {s['limited_by']}: {s['detail']}"
        if s["limited_by"] == "time":
            last = s["probes"][-1]
            tail = "the cap" if last["status"] == "planned" else f"n = {last['n']}: {last['detail']}"
            line += f"; XLA's plan fits the budget up to n = {s['plan_fits_up_to']} ({tail})"
        lines.append(line)
    return "\n".join(lines)


def plot(rows: list[dict], searches: list[dict], shape: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_memory) = plt.subplots(1, 2, figsize=(12, 4.8))
    for impl, mode in dict.fromkeys((r["impl"], r["mode"]) for r in rows):
        points = sorted((r["n"], r["median_s"]) for r in rows if (r["impl"], r["mode"]) == (impl, mode))
        ax_time.loglog(*zip(*points), marker="o", linestyle="-" if mode == "forward" else "--", label=f"{impl} {mode}")
    ax_time.set(xlabel="sequence length n", ylabel="median wall time (s)",
                title=f"attention time, B={shape['batch']} H={shape['heads']} d={shape['head_dim']} fp32")
    for search in searches:
        done = [p for p in search["probes"] if p["status"] == "ok"]
        if done:
            line, = ax_memory.loglog([p["n"] for p in done], [p["peak_added_bytes"] / 2**20 for p in done], marker="o",
                                     label=f"{search['impl']} {search['mode']}: peak RSS rise")
            planned = [p for p in search["probes"] if "planned_bytes" in p]
            ax_memory.loglog([p["n"] for p in planned], [p["planned_bytes"] / 2**20 for p in planned], "--",
                             color=line.get_color(), label=f"{search['impl']}: XLA plan")
    ns = sorted({p["n"] for s in searches for p in s["probes"] if "planned_bytes" in p})
    if ns:
        ax_memory.loglog(ns, [shape["batch"] * shape["heads"] * n * n * 4 / 2**20 for n in ns], "k:", label="one fp32 score tensor")
    ax_memory.set(xlabel="sequence length n", ylabel="MiB", title="peak memory of one call (fresh process each)")
    save_figure(fig, (ax_time, ax_memory), path)


def run(args: argparse.Namespace) -> int:
    impls = _names(args.impls, IMPLEMENTATIONS, "--impls")
    modes = _names(args.modes, MODES, "--modes")
    memory_impls = _names(args.memory_impls, IMPLEMENTATIONS, "--memory-impls")
    for name in ("repeats", "batch", "heads", "head_dim", "block_size"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    ns = sequence_lengths(args.min_n, args.max_n)
    shape = {"batch": args.batch, "heads": args.heads, "head_dim": args.head_dim,
             "block_size": args.block_size, "causal": args.causal}
    budget_bytes = int(args.memory_budget_gb * 2**30) if args.memory_budget_gb else _available_bytes() // 2
    out = output_directory(args.out, "--out")
    machine = {**environment(), "device": str(jax.devices()[0]), "memory_available_bytes": _available_bytes()}
    print(f"jaxformer bench attention: {machine['device']}, {machine['cpu_model']}, {machine['cores']} cores; "
          f"B={args.batch} H={args.heads} d={args.head_dim} block={args.block_size} causal={args.causal}", flush=True)
    if "fused" in impls or "fused" in memory_impls:
        from jaxformer.functional import fused_attention

        available = fused_attention.fused_available()
        machine["fused_available"] = available
        if available:
            print(f"fused kernel: loaded from {fused_attention.loaded_path()}", flush=True)
        else:
            print(f"fused kernel unavailable, so the fused rows time the plain path: "
                  f"{fused_attention.unavailable_reason()}", flush=True)

    rows = time_attention(ns, impls, modes, repeats=args.repeats, warmup=args.warmup, shape=shape) if impls and modes else []
    slope_fits = slopes(rows, fit_min_n=args.fit_min_n) if rows else {}
    for mode in modes if rows else ():
        print(f"\n{mode}: median of {args.repeats} interleaved calls, ms [local log-log slope]")
        print(timing_table(rows, slope_fits, impls, mode, args.fit_min_n))

    searches = []
    for impl in memory_impls:
        print(f"  memory search: {impl} {args.memory_mode}", flush=True)
        searches.append(largest_n(impl, args.memory_mode, start_n=args.memory_start_n, max_n=args.memory_max_n,
                                  budget_bytes=budget_bytes, time_budget_s=args.probe_time_s,
                                  total_time_s=args.memory_total_s, shape=shape))
    if searches:
        print(f"\nmemory, one {args.memory_mode} call per fresh process (budget {budget_bytes / 2**30:.1f} GiB, "
              f"{args.probe_time_s:g} s per probe): XLA plan (memory_analysis) and measured peak RSS rise (VmHWM)")
        print(memory_table(searches, shape))

    report = {"machine": machine, "shape": shape, "repeats": args.repeats, "memory_budget_bytes": budget_bytes,
              "timings": rows, "slopes": slope_fits, "memory": searches}
    write_atomically(out / "attention.json", lambda handle: handle.write(json.dumps(report, indent=1).encode()))
    plot(rows, searches, shape, out / "attention.png")
    print(f"\nwrote {out / 'attention.json'} and {out / 'attention.png'}")
    return 0
