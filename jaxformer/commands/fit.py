"""`jaxformer fit RESULTS`: scaling-law fits (Chinchilla Approaches 1–3) with bootstrap intervals.

RESULTS is a CSV, Parquet or JSONL table of runs, or a sweep directory. Prints a summary
(or one JSON object with ``--json``, which ``jaxformer allocate --law`` reads) and writes
PNG and SVG figures with ``--plots DIR``.

The compiled solver programs are kept in JAX's persistent compilation cache
(``$JAXFORMER_CACHE_DIR``, default ``~/.cache/jaxformer/xla``; empty: off), so a later fit of
a table of the same size loads them instead of compiling; docs/fit-speed.md has the timings.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys

from jaxformer.arguments import integer, number
from jaxformer.runtime import enable_compilation_cache
from jaxformer.scaling.bootstrap import REFERENCE_BUDGET, RESAMPLES
from jaxformer.scaling.isoflop import RESAMPLE
from jaxformer.scaling.report import APPROACHES, fit_table, jsonable
from jaxformer.scaling.table import load_table

# every file is written before run returns and no thread is left working: `jaxformer.cli` skips teardown
EXIT_AT_ONCE = True
MAX_RESAMPLES = 100_000  # Approach 3 holds resamples × starts × runs weights in memory: 0.8 GB at 240 runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="table of runs (.csv, .parquet, .jsonl) or a sweep directory")
    parser.add_argument("--params", default="total", choices=("total", "non_embedding"),
                        help="a sweep directory's N: total parameters (default) or without embeddings")
    parser.add_argument("--flops", choices=("exact", "6ND"),
                        help="a sweep directory's C: exact training FLOPs or 6ND (default: as the sweep planned)")
    parser.add_argument("--approach", default="all", choices=APPROACHES,
                        help="1 loss envelope, 2 IsoFLOP parabolas, 3 parametric law, all (default: each the runs "
                             "support, the others noted as skipped)")
    parser.add_argument("--bootstrap", type=integer(0, MAX_RESAMPLES), default=RESAMPLES, metavar="N",
                        help="resamples for intervals (0: none)")
    parser.add_argument("--level", type=number(above=0, below=1), default=0.95,
                        help="confidence level of the percentile intervals")
    parser.add_argument("--seed", type=integer(0), default=0, help="bootstrap seed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plots", metavar="DIR", help="write isoflop/contour/n_opt/residuals .png and .svg here")
    parser.add_argument("--exclude-highest-loss", type=int, default=0, metavar="K",
                        help="drop the K runs with the highest loss (Besiroglu et al. drop 5)")
    parser.add_argument("--budgets", type=number(above=0), nargs="+", default=[REFERENCE_BUDGET], metavar="C",
                        help="FLOP budgets at which to report tokens per parameter (default 5.76e23)")
    parser.add_argument("--budget-tol", type=number(above=0), default=0.1,
                        help="Approach 2 without budget labels: runs within this relative C are one budget")
    parser.add_argument("--keep-edges", action="store_true",
                        help="Approach 2: fit the power laws to minima at the edge of their sizes too (default: leave them out)")
    parser.add_argument("--approach2-resample", default="runs", choices=RESAMPLE,
                        help="Approach 2's bootstrap: draw each budget's runs (default), normal noise of the pooled "
                             "residuals' size, or each run's own residual with a random sign (wild; one sign per "
                             "--bootstrap-groups group)")
    parser.add_argument("--bootstrap-groups", metavar="COL[,COL]",
                        help="Approach 3's bootstrap draws groups of runs equal in these columns (a sweep directory: "
                             "its plan.json fields) instead of single runs (e.g. N,seed: the branches of one WSD "
                             "trunk share its stable phase); Approach 2's wild bootstrap then draws a sign per group")
    parser.add_argument("--bootstrap-starts", type=integer(1), default=4,
                        help="Approach 3 starts per resample: the point optimum and the best grid starts")
    for role, flag in (("N", "--n-col"), ("D", "--d-col"), ("C", "--c-col"), ("loss", "--loss-col"),
                       ("budget", "--budget-col"), ("run", "--run-col")):
        parser.add_argument(flag, help=f"column holding {role} (default: found by name)")


def run(args: argparse.Namespace) -> int:
    if args.plots:
        _check_plots(Path(args.plots))
    group_by = args.bootstrap_groups.split(",") if args.bootstrap_groups else ()
    if Path(args.results).is_dir():  # a sweep hands its runs over as a table
        from jaxformer.sweep.table import sweep_table

        table = sweep_table(args.results, params=args.params, flops=args.flops, loss_col=args.loss_col,
                            group_by=group_by)
    else:
        table = load_table(args.results, n_col=args.n_col, d_col=args.d_col, c_col=args.c_col,
                           loss_col=args.loss_col, budget_col=args.budget_col, run_col=args.run_col,
                           group_by=group_by)
    table = table.exclude_highest_loss(args.exclude_highest_loss)
    enable_compilation_cache()  # the solver's programs compile once per machine, not once per fit
    report = fit_table(table, args.approach, resamples=args.bootstrap, seed=args.seed, level=args.level,
                       budgets=args.budgets, budget_tol=args.budget_tol, bootstrap_starts=args.bootstrap_starts,
                       keep_edges=args.keep_edges, resample2=args.approach2_resample)
    outside = report.outside_intervals()
    if outside:
        print(f"warning: point estimates outside their {100 * args.level:g}% bootstrap intervals (the resamples "
              f"mostly ended at another optimum): {'; '.join(outside)}", file=sys.stderr)
    if args.json:
        print(json.dumps(jsonable(report.to_dict()), indent=1, allow_nan=False))
    else:
        print(report.text())
    if args.plots:  # after the results: a figure that cannot be written does not lose them
        paths = report.write_plots(args.plots)
        print(f"wrote {len(paths)} figures to {args.plots}", file=sys.stderr)
    return 0


def _check_plots(directory: Path) -> None:
    """``--plots`` must be a directory, or a path whose nearest existing part is one: checked before the fit."""
    existing = next(path for path in (directory, *directory.parents) if path.exists())
    if not existing.is_dir():
        raise ValueError(f"--plots {directory}: {existing} is a file, not a directory")
