"""`jaxformer allocate --flops C`: compute-optimal N, D, tokens per parameter and loss at budget C.

The law is a preset (``chinchilla``: Hoffmann et al.'s published Approach-3 fit, the
default; ``epoch``: Besiroglu et al.'s refit), or the JSON of ``jaxformer fit --json``
(``--law FIT.json``, Approach 3's closed form, or ``--approach 1|2`` for their power laws),
or a JSON object with E, A, B, alpha, beta.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from jaxformer.scaling.allocation import PRESETS, Allocation, allocate, load_law


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--flops", type=float, nargs="+", required=True, metavar="C", help="training FLOP budgets")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--law", metavar="FIT.json", help="output of `jaxformer fit --json`, or {E, A, B, alpha, beta}")
    source.add_argument("--preset", choices=sorted(PRESETS), help="a published law (default: chinchilla)")
    parser.add_argument("--approach", choices=("1", "2", "3"), help="which fit in FIT.json (default: 3 if present)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    if args.law:
        name, law = load_law(args.law, args.approach)
    else:
        if args.approach:
            raise ValueError("--approach selects a fit inside --law FIT.json")
        name, law = args.preset or "chinchilla", PRESETS[args.preset or "chinchilla"]
    result = allocate(law, args.flops)
    _check(result, f"{args.law} ({name})" if args.law else name)
    if args.json:
        print(json.dumps({"law": name, **law.to_dict(), "allocation": result.rows()}, indent=1, allow_nan=False))
        return 0
    header = f"{'FLOPs':>10} {'N_opt':>10} {'D_opt':>10} {'D/N':>7} {'loss':>7}"
    print(f"law: {name} ({', '.join(f'{k}={v:.4g}' for k, v in law.to_dict().items() if v is not None)})")
    print(header)
    for row in result.rows():
        loss = "n/a" if row["loss"] is None else f"{row['loss']:.5g}"
        print(f"{row['flops']:10.3g} {row['N_opt']:10.4g} {row['D_opt']:10.4g} {row['tokens_per_param']:7.4g} "
              f"{loss:>7}")
    return 0


def _check(result: Allocation, source: str) -> None:
    """Refuses an allocation that is not a positive finite N and D (one line naming the budget); warns, one line
    per budget on stderr, where the optimum is under one parameter or one token (a budget below any model's)."""
    for C, N, D in zip(result.C, result.N, result.D):
        if not (np.isfinite([N, D]).all() and N > 0 and D > 0):
            raise ValueError(f"{source}: no finite compute-optimal allocation at {C:g} FLOPs (N_opt {N:g}, "
                             f"D_opt {D:g})")
        if N < 1 or D < 1:
            print(f"warning: at {C:g} FLOPs the optimum is N_opt {N:.4g}, D_opt {D:.4g}: under one "
                  f"{'parameter' if N < 1 else 'token'}, so no model trains on this budget", file=sys.stderr)
