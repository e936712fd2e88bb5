"""The long study's held-out neighbours, trained from its committed files.

The study's own `verify:` trained only the compute-optimal size at 3e13 FLOPs (the neighbours would have run past
that session), and its run directories were not committed, so a relaunch of the sweep would train everything
again. This script rebuilds what the relaunch would have had: the spec (`spec.yaml`, its `verify.sizes` widened to
[0.5, 1, 2] as in `sweeps/cpu-chinchilla-ladder-2seeds.yaml`), the plan's budgets (`plan.json`) and Approach 3's
fit with its 1,000 resamples, refitted from `results.csv` with the sweep's settings. It checks that the refit
predicts what `verify.json` recorded for the compute-optimal size (the point to 1e-5, the interval to 0.5%), trains the four neighbour runs (0.5x and 2x N_opt,
two seeds each) with the sweep's warm single-threaded workers, and writes `verify_neighbours.json`: each size's
comparison with the law (the compute-optimal size's losses from `verify.json`) and the optimum the three sizes'
means locate.

    python experiments/cpu_chinchilla_2seeds_wholefiles/neighbours.py --out /tmp/neighbours
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import yaml

from jaxformer.scaling.report import fit_table, jsonable
from jaxformer.scaling.table import load_table
from jaxformer.sweep.directory import write_configs
from jaxformer.sweep.executors import run_local
from jaxformer.sweep.fit import pooled_seed_noise
from jaxformer.sweep.plan import PlannedRun
from jaxformer.sweep.queue import WorkQueue
from jaxformer.sweep.spec import load_spec
from jaxformer.sweep.verify import compare_held_out, measured_optimum, plan_verify, predict

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a scratch sweep directory for the four runs")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    # spec.yaml is the launch's resolved spec: the tuning stage's rule (tune.json's formula) already in
    # hyperparameters, so the stage itself is left out, as a relaunch that found it done would skip it
    resolved = yaml.safe_load((HERE / "spec.yaml").read_text())
    resolved.pop("tune")
    resolved["verify"]["sizes"] = [0.5, 1.0, 2.0]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spec.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    spec = load_spec(args.out / "spec.yaml")
    fields = {f.name for f in dataclasses.fields(PlannedRun)}
    runs = [PlannedRun(**{k: v for k, v in entry.items() if k in fields}, config={})
            for entry in json.loads((HERE / "plan.json").read_text())["runs"]]
    rows = list(csv.DictReader((HERE / "results.csv").open()))
    table = load_table(HERE / "results.csv", group_by=spec.fit.bootstrap_groups)
    report = fit_table(table, "3", resamples=spec.fit.bootstrap, resample2=spec.fit.approach2_resample)

    held_out = plan_verify(spec, runs, report)
    committed = json.loads((HERE / "verify.json").read_text())
    optimal = [run for run in held_out if run.name in committed["runs"]]
    noise = pooled_seed_noise(rows)
    again = predict(report, committed["N"], committed["D"], noise[0], len(optimal), noise[1])
    print(f"refit: compute-optimal {optimal[0].name} predicted {again['loss']:.10f} {again['interval']} "
          f"(verify.json: {committed['predicted']['loss']:.10f} {committed['predicted']['interval']})", flush=True)
    # not bit-identical: the sweep fitted in its launcher, whose XLA flags differ, and Approach 3's bootstrap ends
    # its resampled fits on a flat valley, so the interval moves a little with the floating point
    if [run.name for run in optimal] != committed["runs"] or not (
            np.isclose(again["loss"], committed["predicted"]["loss"], rtol=1e-5)
            and np.allclose(again["interval"], committed["predicted"]["interval"], rtol=5e-3)):
        print("the refit does not reproduce verify.json; nothing trained", file=sys.stderr)
        return 1

    neighbours = [run for run in held_out if run.name not in committed["runs"]]
    for folder in ("configs", "runs"):
        (args.out / folder).mkdir(exist_ok=True)
    write_configs(args.out, neighbours)
    names = [run.name for run in neighbours]
    print(f"training {', '.join(names)} ({args.workers} workers x 1 thread)", flush=True)
    run_local(args.out, WorkQueue(names), args.workers, 1,
              lambda name, event, outcome: print(f"{name}: {event}{'' if outcome is None else f' {outcome}'}",
                                                 flush=True))

    sizes: dict[int, list[PlannedRun]] = {}
    for run in neighbours:
        sizes.setdefault(run.N, []).append(run)
    compared = [{key: committed[key] for key in ("run", "runs", "seeds", "losses", "relative_errors", "N", "D",
                                                 "tokens_per_param", "predicted", "measured_loss", "relative_error",
                                                 "within_tolerance", "inside_interval", "inside_prediction_interval")}]
    compared += [compare_held_out(args.out, repeats, report, spec, noise) for repeats in sizes.values()]
    compared.sort(key=lambda c: c["N"])
    result = {"budget": held_out[0].budget, "predicted_n_opt": committed["predicted_n_opt"], "sizes": compared,
              "measured_n_opt": measured_optimum(compared),
              "command": "python experiments/cpu_chinchilla_2seeds_wholefiles/neighbours.py --out DIR"}
    (HERE / "verify_neighbours.json").write_text(json.dumps(jsonable(result), indent=1) + "\n")
    for c in compared:
        print(f"N {c['N']:>9,}  D/N {c['tokens_per_param']:6.1f}  losses {c['losses']}  mean {c['measured_loss']:.4f}"
              f"  predicted {c['predicted']['loss']:.4f} {c['predicted']['interval']}  error {c['relative_error']:+.2%}")
    found = result["measured_n_opt"]
    print(f"N_opt at C = {held_out[0].budget:.3g}: predicted {result['predicted_n_opt']:,.0f}, measured "
          + ("none (not bracketed by the three sizes)" if found is None else f"{found:,.0f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
