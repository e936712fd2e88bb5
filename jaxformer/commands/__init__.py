"""The command layer: one module per `jaxformer` sub-command, listed in `jaxformer.cli.COMMANDS`.

Each module exposes ``add_arguments(parser)`` and ``run(args) -> int``. This is the only
place that parses argv and prints for users: the library packages take typed arguments,
return values (or report through a callback) and never import this package. Modules are
imported one at a time, on first use, so ``jaxformer count`` does not pay for Optax or Orbax.
"""
