"""`jaxformer bench WHAT`: benchmarks print ratios side by side from one run and save JSON and plots.

Each benchmark module (`jaxformer.benchmarks`) exposes
``add_arguments(parser)`` and ``run(args) -> int``, like the sub-commands of
`jaxformer.commands`; this dispatcher imports only the chosen one. Performance is measured
here, never by timed tests.
"""

from __future__ import annotations

import argparse
import importlib

# what -> (module, one-line help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "attention": (
        "jaxformer.benchmarks.attention",
        "naive vs blockwise vs XLA attention: time and log-log slopes, peak memory, largest n",
    ),
    "decode": (
        "jaxformer.benchmarks.decode",
        "per-token latency with and without the KV cache, speedup, cache bytes vs the formula",
    ),
    "train": (
        "jaxformer.benchmarks.train",
        "the real train step's tokens/s and MFU against PyTorch eager on the same model, side by side",
    ),
    "profile": (
        "jaxformer.benchmarks.profile",
        "where the train step's time goes: thread time per XLA instruction, by class (matmul, copy, other)",
    ),
    "together": (
        "jaxformer.benchmarks.together",
        "R runs of one shape as one program (vmap, lax.map) against R lone steps: ms per round, ratios, compile",
    ),
    "sweep": (
        "jaxformer.benchmarks.sweep",
        "a sweep plan end to end: jaxformer sweep vs a PyTorch eager twin of the same runs, wall times, "
        "train-step share, FLOP/s vs peak",
    ),
    "fit": (
        "jaxformer.benchmarks.fit",
        "Approach-3 fit: pooled JAX L-BFGS vs scipy L-BFGS-B from 4500 starts, and bootstrap time",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # only the chosen benchmark's module is imported (in run), as jaxformer.cli does for commands
    parser.add_argument("what", choices=list(BENCHMARKS),
                        help="; ".join(f"{what}: {help_text}" for what, (_, help_text) in BENCHMARKS.items()))
    parser.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options: jaxformer bench WHAT --help")
    parser.set_defaults(_parser_class=type(parser))


def run(args: argparse.Namespace) -> int:
    module_name, help_text = BENCHMARKS[args.what]
    module = importlib.import_module(module_name)
    bench_parser = args._parser_class(prog=f"jaxformer bench {args.what}", description=help_text)
    module.add_arguments(bench_parser)
    return int(module.run(bench_parser.parse_args(args.options)) or 0)
