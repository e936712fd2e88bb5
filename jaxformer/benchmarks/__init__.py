"""Benchmarks behind ``jaxformer bench WHAT``: one module per WHAT, listed in
``jaxformer.commands.bench.BENCHMARKS``."""
