"""The `jaxformer` command line: a thin dispatcher over the sub-command modules.

Each sub-command is a module of `jaxformer.commands` exposing two functions,
``add_arguments(parser)`` and ``run(args) -> int``. They are imported lazily, so
`jaxformer count` does not pay for importing Optax or Orbax.

User errors (``ValueError``, ``FileNotFoundError``, and a path that is the wrong kind or not
permitted: a file where a directory goes, say) print one line and exit 2; another ``OSError`` (a full
disk) prints one line and exits 1. Set ``JAXFORMER_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import signal
import sys
import warnings

from jaxformer.files import is_input_error
from jaxformer.runtime import reexec_tuned
from jaxformer.train.interrupts import raise_swallowed_interrupts
from jaxformer.train.late_reports import ignore_failed_write_tracebacks, ignore_reads_outliving_their_loop


# sub-command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "count": ("jaxformer.commands.count", "exact parameter, FLOP and KV-cache counts of a model"),
    "generate": ("jaxformer.commands.generate", "sample text from a run, a config or a preset, with a KV cache"),
    "bench": ("jaxformer.commands.bench", "benchmarks: ratios side by side in one run, tables, JSON and log-log plots"),
    "train": ("jaxformer.commands.train", "train a decoder on a token budget, with checkpoints and exact resume"),
    "sweep": ("jaxformer.commands.sweep", "train an (N, D) grid or IsoFLOP budgets, locally or on Ray, then fit"),
    "tune": ("jaxformer.commands.tune", "a sweep's tuning stage only: learning rates at a few sizes, the fitted rule"),
    "results": ("jaxformer.commands.results", "one table of a sweep's runs: N, D, C, losses, status"),
    "fit": ("jaxformer.commands.fit", "scaling-law fits (Chinchilla Approaches 1-3) with bootstrap intervals"),
    "allocate": ("jaxformer.commands.allocate", "compute-optimal N, D, tokens per parameter and loss at C"),
    "import-hf": ("jaxformer.commands.import_hf", "a local Hugging Face checkpoint or GGUF file as a jaxformer model"),
    "export-hf": ("jaxformer.commands.export_hf", "a trained or imported model as a directory transformers loads"),
}


class _Parser(argparse.ArgumentParser):
    """argparse already exits 2 on usage errors; keep its message to one line.

    Negative numbers in scientific notation (``--flops -1e20``) are values, not options, so the
    command's own check can name them.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

    def error(self, message: str) -> None:  # noqa: D102
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """All sub-commands are listed; only ``selected`` has its module imported."""
    parser = _Parser(prog="jaxformer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == selected:
            module = importlib.import_module(module_name)
            module.add_arguments(command_parser)
            command_parser.set_defaults(_run=module.run, _exit_at_once=getattr(module, "EXIT_AT_ONCE", False))
    return parser


def _one_line_notes() -> None:
    """Deprecation notes of config keys (`ConfigDeprecation`) print as one ``note:`` line each."""
    show = warnings.showwarning
    if getattr(show, "one_line_notes", False):
        return

    def one_line(message, category, filename, lineno, file=None, line=None):
        if category.__name__ == "ConfigDeprecation":
            print(f"note: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    one_line.one_line_notes = True
    warnings.showwarning = one_line


def _exit_at_once(code: int) -> None:
    """Ends the process without Python's teardown, whose share for a JAX process (stopping the runtime,
    freeing every module) is work no one waits for; the output streams and log handlers are flushed first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Runs one sub-command; from the command line (``argv`` None) first in the tuned process
    environment of `jaxformer.runtime`, and a command whose module sets ``EXIT_AT_ONCE`` (it leaves
    nothing running or unwritten) ends the process as soon as it returns."""
    from_command_line = argv is None
    if argv is None:
        argv = sys.argv[1:]
        reexec_tuned(argv)
    _one_line_notes()
    raise_swallowed_interrupts()
    ignore_reads_outliving_their_loop()  # the command owns its process (a library restores its caller's hooks)
    ignore_failed_write_tracebacks()  # as above, for absl's logger filters
    selected = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(selected).parse_args(argv)
    try:
        code = int(args._run(args) or 0)
        if from_command_line and args._exit_at_once:
            _exit_at_once(code)
        return code
    except BrokenPipeError:  # the reader of stdout stopped early (`| head`): end quietly, as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush raises nothing
        return 128 + int(signal.SIGPIPE)
    except (ValueError, OSError) as error:
        if os.environ.get("JAXFORMER_DEBUG"):
            raise
        print(f"jaxformer {args.command}: error: {error}", file=sys.stderr)
        return 1 if isinstance(error, OSError) and not is_input_error(error) else 2
    except KeyboardInterrupt:
        print(f"jaxformer {args.command}: interrupted", file=sys.stderr)
        if from_command_line and args._exit_at_once:  # a teardown of JAX cut short by Ctrl-C can crash (SIGSEGV)
            _exit_at_once(130)
        return 130


if __name__ == "__main__":
    sys.exit(main())
