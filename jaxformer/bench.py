"""`jaxformer bench WHAT`: benchmarks print ratios side by side from one run and save JSON and plots.

Each benchmark module exposes ``add_arguments(parser)`` and ``run(args) -> int``, like the
sub-commands of ``jaxformer.cli``. Performance is measured here, never by timed tests.
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
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", required=True, parser_class=type(parser))
    for what, (module_name, help_text) in BENCHMARKS.items():
        bench_parser = sub.add_parser(what, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(bench_parser)
        bench_parser.set_defaults(_bench_run=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args._bench_run(args) or 0)
