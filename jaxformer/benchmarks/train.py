"""`jaxformer bench train`: the real train step's tokens/s and MFU against PyTorch eager, side by side.

For a ladder of the CPU sweeps' sizes (byte vocabulary), jaxformer's jitted train step and
a PyTorch twin of the identical model and optimizer (`torch_reference`) are timed in
alternating repeats in one process, each timed run after an untimed one of its own side (the first run after the
other side's pays for the memory that run churned); medians are compared as ratios, and MFU is measured
against a matmul peak probed in the same run. Both use the whole machine: PyTorch its
intra-op threads, jaxformer (as `jaxformer train` does) a data-parallel mesh over one JAX
device per core (`jaxformer.runtime`); the ``dev`` column says over how many devices.
``--one-device`` also times each size on one device, which has every core's threads for its matmuls, against
the mesh (the per-size device layout). ``--layout`` also compares thread layouts (one process using every core vs one
single-threaded process per core, run side by side) and records the faster one for
`jaxformer sweep`'s local executor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from jaxformer.arguments import integer
from jaxformer.benchmarks.environment import environment, package_version
from jaxformer.benchmarks.outputs import output_directory, output_file
from jaxformer.benchmarks.sweep import ChildFailed
from jaxformer.files import write_json_atomic
from jaxformer.runtime import LAYOUT_FILE

# torch's bf16 steps are timed only where its bf16 matmul reaches this share of its fp32 one
TORCH_BF16_FLOOR = 0.1
LADDER = ((16, 1, 128), (32, 2, 128), (64, 2, 128), (128, 4, 128), (256, 4, 256), (512, 8, 256))
LAYOUT_MAX_D = 128  # --layout compares thread layouts at the sizes up to this d_model (the sweeps' models)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=",".join(f"{d}:{l}:{t}" for d, l, t in LADDER),
                        help="comma-separated d_model:layers:seq_len")
    parser.add_argument("--batch", type=integer(1), default=32, help="sequences per step")
    parser.add_argument("--attention-impl", default="naive",
                        help="jaxformer's kernel.attention_impl (naive | blockwise | xla | fused | auto: the "
                             "fastest measured per size, kept in the machine's cache for later runs); torch uses SDPA")
    parser.add_argument("--matmul-impl", default="xla",
                        help="jaxformer's kernel.matmul_impl (xla | onednn: projections through oneDNN | auto: the "
                             "faster measured per size, cached per machine)")
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="compute dtypes to time, comma-separated (bfloat16: fp32 masters, against torch autocast)")
    parser.add_argument("--steps", type=integer(1), default=10, help="steps per timed repeat")
    parser.add_argument("--repeats", type=integer(1), default=5, help="alternating repeats, each timed run after an untimed one of its side (medians reported)")
    parser.add_argument("--no-torch", action="store_true", help="time jaxformer only")
    parser.add_argument("--layout", action="store_true", help="also compare process/thread layouts for sweeps")
    parser.add_argument("--one-device", action="store_true",
                        help="also time each size on one device with every core's threads, against the "
                             "data-parallel mesh over one device per core (oneDNN matmuls run on one thread a call "
                             "either way, docs/cpu-speed.md session 12)")
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--out", help="directory for bench_train.json (and layout results)")


def bench_config(d_model: int, layers: int, seq_len: int, batch: int, dtype: str = "float32",
                 attention_impl: str = "naive", matmul_impl: str = "xla"):
    """A jaxformer `TrainConfig` of the CPU sweeps' architecture (the `tiny` preset) at this size, compute dtype
    and attention and matmul implementations."""
    from jaxformer.train.config import config_from_dict

    heads = max(1, d_model // 32)
    return config_from_dict({
        "model": {"preset": "tiny", "d_model": d_model, "num_layers": layers, "num_heads": heads,
                  "max_seq_len": max(seq_len, 256)},
        "train": {"batch_size": batch, "seq_len": seq_len, "tokens": batch * seq_len * 1000, "compute_dtype": dtype},
        "kernel": {"attention_impl": attention_impl, "matmul_impl": matmul_impl},
    })


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    sizes = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--sizes entries must be d_model:layers:seq_len positive integers, got {item!r}")
        sizes.append(tuple(int(p) for p in parts))
    return sizes


def measure(config, *, steps: int, repeats: int, torch_too: bool, one_device: bool = False) -> dict:
    """Alternating repeats of the JAX and PyTorch steps (and, with ``one_device``, of the JAX step on the first
    device alone, where the mesh has several), each timed run after an untimed one of its own; medians of tokens/s."""
    from jaxformer.accounting import count_params
    from jaxformer.train.matmul_choice import choose_kernels
    from jaxformer.train.throughput import TrainStepRunner

    config, choice, matmul_choice = choose_kernels(config)
    runner = TrainStepRunner(config)
    alone = TrainStepRunner(config, one_device=True) if one_device and runner.devices > 1 else None
    torch_step = timed_torch_step(config) if torch_too else None
    if torch_step is not None:
        torch_step(steps=1)  # warm-up
    # A step's first run after the other side's pays for the memory that run churned (fresh huge pages cost XLA's
    # threads system time: up to half the JAX step at d >= 128, docs/cpu-speed.md session 22), so where the sides
    # alternate, each timed run follows an untimed one of its own.
    settle = torch_step is not None or alone is not None
    jax_times, torch_times, alone_times = [], [], []
    for _ in range(repeats):
        jax_times.append(_timed_after_settling(lambda: runner.run(steps), settle))
        if alone is not None:
            alone_times.append(_timed_after_settling(lambda: alone.run(steps), settle))
        if torch_step is not None:
            torch_times.append(_timed_after_settling(lambda: torch_step(steps=steps), settle))
    tokens = steps * runner.tokens_per_step
    result = {
        "dtype": config.train.compute_dtype, "attention_impl": choice.attention_impl, "kernel_choice": choice.to_record(),
        "matmul_impl": matmul_choice.matmul_impl, "matmul_choice": matmul_choice.to_record(),
        "d_model": config.model.d_model, "layers": config.model.num_layers, "seq_len": config.train.seq_len,
        "batch": config.train.batch_size, "params": count_params(config.model).total, "compile_s": runner.compile_s,
        "devices": runner.devices,
        "flops_per_token": runner.flops_per_step / runner.tokens_per_step,
        "jax_tokens_per_s": tokens / statistics.median(jax_times),
    }
    if alone_times:
        result["one_device_tokens_per_s"] = tokens / statistics.median(alone_times)
        result["one_device_ratio"] = result["one_device_tokens_per_s"] / result["jax_tokens_per_s"]
    if torch_times:
        result["torch_tokens_per_s"] = tokens / statistics.median(torch_times)
        result["ratio"] = result["jax_tokens_per_s"] / result["torch_tokens_per_s"]
    return result


def _timed_after_settling(run, settle: bool) -> float:
    """Seconds of ``run()``, after one untimed ``run()`` when ``settle``."""
    if settle:
        run()
    return run()


def timed_torch_step(config) -> Callable[..., float]:
    """``timed(steps=n) -> seconds`` of ``n`` PyTorch training steps of ``config``'s model on one fixed batch of
    random windows (`torch_reference.make_torch_step` with ``config.optimizer``'s settings, bf16 autocast when
    ``train.compute_dtype`` is bfloat16): the peer side of `measure`, usable on its own."""
    import torch

    from jaxformer.benchmarks.torch_reference import make_torch_step
    from jaxformer.train.throughput import random_windows

    opt = config.optimizer
    step = make_torch_step(config.model, lr=opt.lr, betas=(opt.beta1, opt.beta2), weight_decay=opt.weight_decay,
                           eps=opt.eps, grad_clip=opt.grad_clip, bf16=config.train.compute_dtype == "bfloat16")
    windows = torch.from_numpy(random_windows(config)[0].astype(np.int64))

    def timed(steps: int) -> float:
        started = time.perf_counter()
        for _ in range(steps):
            loss = step(windows)
        float(loss.detach())
        return time.perf_counter() - started

    return timed


def _layout(sizes, batch: int, steps: int) -> dict:
    """Aggregate fp32 tokens/s: one process with every core vs one 1-thread process per core, side by side."""
    from jaxformer.sweep.executors import thread_environment

    cores = os.cpu_count() or 1
    results = {}
    for d, layers, seq_len in sizes:
        command = [sys.executable, "-m", "jaxformer.cli", "bench", "train", "--sizes", f"{d}:{layers}:{seq_len}",
                   "--batch", str(batch), "--steps", str(steps), "--repeats", "3", "--no-torch", "--dtypes", "float32"]

        def launch(threads: int, count: int) -> float:
            with tempfile.TemporaryDirectory(prefix="jaxformer-layout-") as scratch:  # not a name others can guess
                processes = []
                for index in range(count):
                    path, log = Path(scratch) / f"{index}.json", Path(scratch) / f"{index}.log"
                    with open(log, "w") as stderr:  # a file: a full pipe would stall one side of the comparison
                        processes.append((subprocess.Popen([*command, "--json", str(path)], stderr=stderr,
                                                           env=thread_environment(threads), stdout=subprocess.DEVNULL),
                                          path, log))
                codes = [process.wait() for process, _, _ in processes]
                for code, (_, path, log) in zip(codes, processes):
                    if code != 0:
                        last = (log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
                        raise ChildFailed(f"--layout: `jaxformer {' '.join(command[3:])}` with {threads or 'all'} "
                                          f"threads exited with status {code}: {last}", code)
                return sum(json.loads(path.read_text())["sizes"][0]["jax_tokens_per_s"] for _, path, _ in processes)

        results[f"{d}:{layers}:{seq_len}"] = {"1x{}".format(cores): launch(0, 1), f"{cores}x1": launch(1, cores)}
    wins = sum(value[f"{cores}x1"] > value[f"1x{cores}"] for value in results.values())
    choice = {"processes": cores, "threads": 1} if wins * 2 >= len(results) else {"processes": 1, "threads": 0}
    return {"cores": cores, "tokens_per_s": results, "choice": choice}


def parse_dtypes(text: str, flag: str = "--dtypes") -> list[str]:
    """The compute dtypes of ``text`` (comma-separated); ``ValueError`` naming ``flag`` on another one."""
    dtypes = [item.strip() for item in text.split(",")]
    for dtype in dtypes:
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"{flag} entries must be float32 or bfloat16, got {dtype!r}")
    return dtypes


def fallback_notes(attention_impl: str, matmul_impl: str, dtypes: list[str]) -> list[str]:
    """One note per asked-for kernel this process cannot run, so the figures are read as the plain path's:
    the fused attention kernel or the oneDNN matmul unavailable, or oneDNN without a matmul for a dtype."""
    notes = []
    if attention_impl in ("fused", "auto"):
        from jaxformer.functional import fused_attention

        if not fused_attention.fused_available():
            notes.append(f"fused kernel unavailable, so jaxformer's rows time the plain path: "
                         f"{fused_attention.unavailable_reason()}")
    if matmul_impl in ("onednn", "auto"):
        from jaxformer.functional import onednn_matmul

        if not onednn_matmul.onednn_available():
            notes.append(f"oneDNN matmul unavailable, so jaxformer's rows time XLA's matmul: "
                         f"{onednn_matmul.unavailable_reason()}")
        else:  # loaded, but without a matmul for this dtype on this CPU (bf16 on an AVX2-only one)
            notes += [f"{dtype} rows time XLA's matmul: {reason}" for dtype in dtypes
                      if (reason := onednn_matmul.unsupported_reason(dtype))]
    return notes


def matmul_peaks(dtypes: list[str], torch_too: bool, matmul_impl: str = "xla") -> dict[str, dict[str, float]]:
    """``{dtype: {"jax": FLOP/s, "jax_xla": FLOP/s, "torch": FLOP/s}}``: square matmul peaks probed in this run,
    side by side; ``jax_xla`` is XLA's own, and ``jax`` oneDNN's with ``matmul_impl`` ``onednn`` or ``auto``, else
    XLA's."""
    from jaxformer.train.peak import probe_matmul_peak

    peaks = {}
    for dtype in dtypes:
        xla = probe_matmul_peak(dtype)
        peaks[dtype] = {"jax": probe_matmul_peak(dtype, impl="onednn") if matmul_impl in ("onednn", "auto") else xla,
                        "jax_xla": xla}
        if torch_too:
            from jaxformer.benchmarks.torch_reference import matmul_peak

            peaks[dtype]["torch"] = matmul_peak(dtype)
    return peaks


def run(args: argparse.Namespace) -> int:
    from jaxformer.functional.dense import check_matmul_impl
    from jaxformer.functional.dispatch import check_impl

    sizes, dtypes = parse_sizes(args.sizes), parse_dtypes(args.dtypes)
    if args.attention_impl != "auto":
        check_impl(args.attention_impl)
    for name in ("batch", "steps", "repeats"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name} must be positive, got {getattr(args, name)}")
    if args.matmul_impl != "auto":
        check_matmul_impl(args.matmul_impl)
    layout_sizes = [size for size in sizes if size[0] <= LAYOUT_MAX_D]
    if args.layout and not layout_sizes:
        raise ValueError(f"--layout compares layouts at sizes with d_model <= {LAYOUT_MAX_D}, and --sizes "
                         f"{args.sizes!r} has none")
    if not args.no_torch and package_version("torch") is None:
        raise ValueError("the PyTorch twin needs torch installed (or pass --no-torch)")
    outputs = [output_file(args.json, "--json")]
    if args.out:
        outputs.append(output_file(output_directory(args.out, "--out") / "bench_train.json", "--out"))
    if not args.no_torch:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
    peaks = matmul_peaks(dtypes, not args.no_torch, args.matmul_impl)
    notes = []
    torch_dtypes = {dtype for dtype in dtypes if not args.no_torch}
    if "bfloat16" in torch_dtypes and "float32" in peaks:
        torch_peak = peaks["bfloat16"]["torch"]
        if torch_peak < TORCH_BF16_FLOOR * peaks["float32"]["torch"]:  # no bf16 units: hours of timing, no peer
            torch_dtypes.discard("bfloat16")
            notes.append(f"torch bf16 steps not timed: its bf16 matmul runs at {torch_peak / 1e9:.1f} GFLOP/s, "
                         f"under {TORCH_BF16_FLOOR:.0%} of its fp32 one on this CPU")
    notes += fallback_notes(args.attention_impl, args.matmul_impl, dtypes)
    rows = [measure(bench_config(d, layers, seq_len, args.batch, dtype, args.attention_impl, args.matmul_impl),
                    steps=args.steps,
                    repeats=args.repeats, torch_too=dtype in torch_dtypes, one_device=args.one_device)
            for dtype in dtypes for d, layers, seq_len in sizes]
    for row in rows:  # MFU against the peak of the matmul the row used, so both columns share one denominator
        peak = peaks[row["dtype"]]["jax_xla" if row["matmul_impl"] == "xla" else "jax"]
        row["jax_mfu"] = row["jax_tokens_per_s"] * row["flops_per_token"] / peak
        if "torch_tokens_per_s" in row:
            row["torch_mfu"] = row["torch_tokens_per_s"] * row["flops_per_token"] / peak
    report = {**environment(), "attention_impl": args.attention_impl, "matmul_impl": args.matmul_impl,
              "matmul_peak_flops": peaks["float32" if "float32" in peaks else dtypes[0]]["jax"],
              "matmul_peaks": peaks, "sizes": rows, "notes": notes}  # the environment as `bench sweep` records it
    if args.layout:
        try:
            report["layout"] = _layout(layout_sizes, args.batch, args.steps)
        except ChildFailed as error:  # one line naming the measuring command; nothing saved
            print(f"jaxformer bench: error: {error}", file=sys.stderr)
            return 2 if error.status == 2 else 1
        LAYOUT_FILE.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(LAYOUT_FILE, report["layout"]["choice"])
    _print(report, args)
    for path in outputs:
        if path is not None:
            write_json_atomic(path, report, indent=1)
    return 0


def _print(report: dict, args: argparse.Namespace) -> None:
    print(f"CPU: {report['cpu_model']}; attention {report['attention_impl']}; matmul {report['matmul_impl']}; " + ", ".join(f"{name}={value!r}" for name, value in report["variables"].items()))
    for dtype, peak in report["matmul_peaks"].items():
        print(f"matmul peak {dtype} (this run): jax {peak['jax'] / 1e9:.1f} GFLOP/s"
              + (f", torch {peak['torch'] / 1e9:.1f} GFLOP/s, ratio {peak['jax'] / peak['torch']:.2f}" if "torch" in peak else "")
              + (f" (oneDNN; XLA's own {peak['jax_xla'] / 1e9:.1f})" if args.matmul_impl in ("onednn", "auto") else ""))
    print(f"{'dtype':>9}{'attn':>7}{'matmul':>7}{'d':>5}{'L':>3}{'T':>5}{'params':>11}{'dev':>4}{'jax tok/s':>12}{'torch tok/s':>13}{'ratio':>7}"
          f"{'jax MFU':>9}{'torch MFU':>10}{'compile s':>10}")
    for row in report["sizes"]:
        torch_part = (f"{row['torch_tokens_per_s']:>13,.0f}{row['ratio']:>7.2f}" if "ratio" in row else f"{'':>20}")
        torch_mfu = f"{row['torch_mfu']:>10.1%}" if "torch_mfu" in row else f"{'':>10}"
        print(f"{row['dtype']:>9}{row['attention_impl']:>7}{row['matmul_impl']:>7}{row['d_model']:>5}{row['layers']:>3}{row['seq_len']:>5}{row['params']:>11,}{row['devices']:>4}"
              f"{row['jax_tokens_per_s']:>12,.0f}{torch_part}{row['jax_mfu']:>9.1%}{torch_mfu}{row['compile_s']:>10.1f}")
    for row in report["sizes"]:
        if "one_device_ratio" in row:
            print(f"{row['dtype']} d={row['d_model']}: one device {row['one_device_tokens_per_s']:,.0f} tok/s, "
                  f"{row['one_device_ratio']:.2f}x the {row['devices']}-device mesh")
    for note in report["notes"]:
        print(note)
    if "layout" in report:
        layout = report["layout"]
        for size, values in layout["tokens_per_s"].items():
            print(f"layout {size}: " + ", ".join(f"{k} processes×threads {v:,.0f} tok/s" for k, v in values.items()))
        print(f"sweep layout chosen: {layout['choice']} (saved to {LAYOUT_FILE})")
