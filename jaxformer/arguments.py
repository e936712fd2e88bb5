"""Command-line number types that refuse a bad value in one line (argparse prefixes the option's name).

``parser.add_argument("--repeats", type=integer(1))`` accepts 1, 2, …; ``type=number(above=0)`` a finite
float above 0, ``number(above=0, below=1)`` one strictly between 0 and 1. argparse turns the
`argparse.ArgumentTypeError` into ``error: argument --repeats: …`` and exit status 2.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable


def integer(minimum: int = 0, maximum: int | None = None) -> Callable[[str], int]:
    """An integer in ``[minimum, maximum]``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f"at least {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise argparse.ArgumentTypeError(f"must be an integer {bounds}, got {text}")
        return value
    return parse


def number(*, minimum: float | None = None, above: float | None = None,
           below: float | None = None) -> Callable[[str], float]:
    """A finite float, at least ``minimum`` or above ``above``, and below ``below`` (each when given)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if (not math.isfinite(value) or (minimum is not None and value < minimum)
                or (above is not None and value <= above) or (below is not None and value >= below)):
            lower = f"at least {minimum:g}" if minimum is not None else f"above {above:g}" if above is not None else ""
            bounds = " and ".join(b for b in (lower, f"below {below:g}" if below is not None else "") if b)
            raise argparse.ArgumentTypeError(f"must be a finite number{' ' + bounds if bounds else ''}, got {text}")
        return value
    return parse
