"""`jaxformer bench profile`: where the real train step's time goes, op by op, against its FLOPs.

One size of the `bench train` ladder is compiled as `jaxformer train` compiles it (same mesh,
same step) and a few steps run under `jax.profiler.trace`. XLA:CPU records one trace event per
executed thunk, named by its HLO instruction (``args.hlo_op``); the events of the step's module
are summed per instruction over every device thread. Each instruction is classed from the
compiled HLO text: ``matmul`` when it is a ``dot`` (or a fusion whose body holds one, or a call of
the oneDNN matmul kernel),
``collective`` for all-reduce and friends, ``copy`` for copies and transposes, ``other`` for
the rest (the elementwise and reduction loops). An instruction's time is the wall time of its
thunk on the thread that ran it, summed over devices; a large dot's thunk also covers the work
its Eigen helper threads did meanwhile, which the trace does not record, so these are shares of
the step's op time, not of the cores' capacity.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import tempfile
from pathlib import Path

from jaxformer.arguments import integer
from jaxformer.benchmarks.environment import environment
from jaxformer.benchmarks.outputs import output_file
from jaxformer.files import write_json_atomic

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\((.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", default="256:4:256", help="one d_model:layers:seq_len")
    parser.add_argument("--batch", type=int, default=32, help="sequences per step")
    parser.add_argument("--steps", type=integer(1), default=3, help="steps traced")
    parser.add_argument("--dtype", default="float32", help="compute dtype: float32 or bfloat16")
    parser.add_argument("--attention-impl", default="naive", help="kernel.attention_impl: naive | blockwise | xla | fused")
    parser.add_argument("--matmul-impl", default="xla", help="kernel.matmul_impl: xla | onednn")
    parser.add_argument("--top", type=int, default=15, help="instructions listed")
    parser.add_argument("--json", help="write the profile to this JSON file")


def op_classes(hlo_text: str) -> dict[str, str]:
    """``{instruction: class}`` for every instruction of a compiled HLO module's text."""
    from jaxformer.functional.onednn_matmul import TARGET as ONEDNN_TARGET

    bodies: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)
    computation = ""
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            bodies[computation].append(match.groups())
        elif (header := _COMPUTATION.match(line)) is not None:
            computation = header.group(1)

    def holds_dot(name: str, seen: frozenset = frozenset()) -> bool:
        for _, opcode, rest in bodies.get(name, []):
            called = _CALLS.search(rest)
            if opcode == "dot" or (called and called.group(1) not in seen
                                   and holds_dot(called.group(1), seen | {name})):
                return True
        return False

    classes = {}
    for instructions in bodies.values():
        for name, opcode, rest in instructions:
            called = _CALLS.search(rest)
            if (opcode == "dot" or (opcode == "fusion" and called and holds_dot(called.group(1)))
                    or (opcode == "custom-call" and f'"{ONEDNN_TARGET}"' in rest)):
                classes[name] = "matmul"
            elif opcode.removesuffix("-start").removesuffix("-done") in COLLECTIVES:
                classes[name] = "collective"
            elif opcode in ("copy", "transpose") or (opcode == "fusion" and ("copy" in name or "transpose" in name)):
                classes[name] = "copy"
            else:
                classes[name] = "other"
    return classes


def thunk_seconds(trace_dir: Path, module_prefix: str) -> tuple[dict[str, float], int]:
    """Thread-seconds per HLO instruction of the modules whose name starts with ``module_prefix``,
    and how many threads ran them."""
    path = next(trace_dir.rglob("perfetto_trace.json.gz"))
    data = json.loads(gzip.decompress(path.read_bytes()))
    events = data["traceEvents"] if isinstance(data, dict) else data
    totals: dict[str, float] = collections.defaultdict(float)
    threads = set()
    for event in events:
        args = event.get("args", {})
        if event.get("ph") == "X" and str(args.get("hlo_module", "")).startswith(module_prefix) and "hlo_op" in args:
            totals[args["hlo_op"]] += event["dur"] / 1e6
            threads.add(event["tid"])
    return dict(totals), len(threads)


def profile(config, *, steps: int) -> dict:
    """The traced steps of ``config``'s train step: per-instruction thread-seconds, by class, per step."""
    import jax

    from jaxformer.train.throughput import TrainStepRunner

    runner = TrainStepRunner(config)
    runner.run(1)
    hlo = runner.step.as_text()  # the compiled program the runner runs
    module = re.search(r"HloModule\s+([\w.\-]+)", hlo).group(1)
    classes = op_classes(hlo)
    with tempfile.TemporaryDirectory() as directory:
        with jax.profiler.trace(directory, create_perfetto_trace=True):
            wall_s = runner.run(steps)
        seconds, threads = thunk_seconds(Path(directory), module)
    by_class: dict[str, float] = collections.defaultdict(float)
    for name, value in seconds.items():
        by_class[classes.get(name, "other")] += value / steps
    top = sorted(seconds.items(), key=lambda item: -item[1])
    return {"step_s": wall_s / steps, "devices": runner.devices, "threads": threads,
            "flops_per_step": runner.flops_per_step, "op_s_per_step": sum(seconds.values()) / steps, "by_class": dict(by_class),
            "instructions": [{"name": name, "class": classes.get(name, "other"), "s_per_step": value / steps}
                             for name, value in top]}


def run(args: argparse.Namespace) -> int:
    from jaxformer.benchmarks.train import bench_config, fallback_notes, parse_dtypes, parse_sizes
    from jaxformer.functional.dense import check_matmul_impl
    from jaxformer.functional.dispatch import check_impl
    from jaxformer.train.peak import probe_matmul_peak

    sizes, dtypes = parse_sizes(args.size), parse_dtypes(args.dtype, "--dtype")
    if len(sizes) != 1 or len(dtypes) != 1:
        raise ValueError(f"--size and --dtype take one value each, got {args.size!r} and {args.dtype!r}")
    (d, layers, seq_len), dtype = sizes[0], dtypes[0]
    for name in ("batch", "steps", "top"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name} must be positive, got {getattr(args, name)}")
    check_impl(args.attention_impl)
    check_matmul_impl(args.matmul_impl)
    json_path = output_file(args.json, "--json")
    result = profile(bench_config(d, layers, seq_len, args.batch, dtype, args.attention_impl, args.matmul_impl),
                     steps=args.steps)
    # the kernels asked for but unavailable here: the profile is then the plain path's (as bench train notes it)
    result.update(**environment(), notes=fallback_notes(args.attention_impl, args.matmul_impl, [dtype]), size=args.size, batch=args.batch, dtype=dtype, attention_impl=args.attention_impl,
                  matmul_impl=args.matmul_impl, peak_flops=probe_matmul_peak(dtype, impl=args.matmul_impl))
    _print(result, args.top)
    if json_path is not None:
        write_json_atomic(json_path, result, indent=1)
    return 0


def _print(result: dict, top: int) -> None:
    step_s, op_s = result["step_s"], result["op_s_per_step"]
    print(f"CPU: {result['cpu_model']}; size {result['size']}, batch {result['batch']}, {result['dtype']}, "
          f"{result['devices']} devices")
    print(f"step {step_s * 1e3:.1f} ms wall; {op_s * 1e3:.1f} ms in XLA ops on {result['threads']} threads; "
          f"MFU {result['flops_per_step'] / step_s / result['peak_flops']:.1%} of {result['peak_flops'] / 1e9:.1f} GFLOP/s")
    for name, value in sorted(result["by_class"].items(), key=lambda item: -item[1]):
        print(f"  {name:<11}{value * 1e3:>9.1f} ms  {value / op_s:>6.1%}")
    print(f"{'instruction':<44}{'class':>11}{'ms/step':>9}{'share':>8}")
    for row in result["instructions"][:top]:
        print(f"{row['name'][:43]:<44}{row['class']:>11}{row['s_per_step'] * 1e3:>9.2f}{row['s_per_step'] / op_s:>8.1%}")
    for note in result["notes"]:
        print(note)
