"""The two-seed ladder: the seed-0 long study's runs and the seed-1 ladder's in one table, fitted drawing trunks.

    python experiments/cpu_chinchilla_ladder_seed1/combine.py SEED1_SWEEP_DIR

Writes here: ``results.csv`` (seed 0 from ``cpu_chinchilla_ladder_beta2_wide_icx/``, seed 1 from the sweep),
``fit.json`` and the figures (Approach 3 drawing whole trunks, Approach 2 `wild` with a sign per trunk, 1,000
resamples), ``machine_check.json`` (the seed-0 study's own seed-1 runs at 1e12 against this sweep's) and
``heldout.json`` (the seed-0 study's held-out runs against the two-seed law). README.md reads them.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np

from jaxformer.scaling.report import fit_table, jsonable
from jaxformer.scaling.table import load_table
from jaxformer.sweep.fit import seed_spreads
from jaxformer.sweep.verify import inside, predict

HERE = Path(__file__).resolve().parent
SEED0 = HERE.parent / "cpu_chinchilla_ladder_beta2_wide_icx"
RESAMPLES = 1000


def rows(path: Path) -> list[dict]:
    return [row for row in csv.DictReader(open(path)) if row["status"] == "done"]


def machine_check(seed0: list[dict], seed1: list[dict]) -> dict:
    """Item 4: the runs both sweeps planned (same name: shape, budget, seed) and their two losses."""
    new = {row["run"]: float(row["loss"]) for row in seed1}
    pairs = [{"run": row["run"], "ice_lake": float(row["loss"]), "this_machine": new[row["run"]]}
             for row in seed0 if row["run"] in new]
    for pair in pairs:
        pair["relative_difference"] = pair["this_machine"] / pair["ice_lake"] - 1
    return {"pairs": pairs, "identical": all(p["ice_lake"] == p["this_machine"] for p in pairs)}


def main(seed1_dir: str) -> None:
    seed0 = rows(SEED0 / "results.csv")
    seed1 = rows(Path(seed1_dir) / "results.csv")
    check = machine_check(seed0, seed1)
    (HERE / "machine_check.json").write_text(json.dumps(check, indent=1) + "\n")
    combined = [row for row in seed0 if row["seed"] == "0"] + seed1
    with open(HERE / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(seed0[0]))
        writer.writeheader()
        writer.writerows({key: row.get(key, "") for key in seed0[0]} for row in combined)

    table = load_table(HERE / "results.csv", group_by=("N", "seed"))
    report = fit_table(table, "all", resamples=RESAMPLES, seed=0, resample2="wild")
    (HERE / "fit.json").write_text(json.dumps(jsonable(report.to_dict()), indent=1) + "\n")
    report.write_plots(HERE)
    print(report.text())

    noise = float(np.median(seed_spreads(combined)))
    verify = json.loads((SEED0 / "verify.json").read_text())
    held_out = []
    for run in [verify, *verify.get("neighbours", [])]:
        predicted = predict(report, run["N"], run["D"], noise)
        measured = run["measured_loss"]
        held_out.append({"run": run["run"], "N": run["N"], "D": run["D"], "measured_loss": measured,
                         "predicted": predicted, "relative_error": measured / predicted["loss"] - 1,
                         "inside_interval": inside(measured, predicted["interval"]),
                         "inside_prediction_interval": inside(measured, predicted["prediction_interval"])})
    n_opt = float(report.approach3.law.n_opt(verify["budget"]))
    (HERE / "heldout.json").write_text(json.dumps({"seed_noise": noise, "pairs": len(seed_spreads(combined)),
                                                   "n_opt_at_3e13": n_opt, "runs": held_out}, indent=1) + "\n")
    print(json.dumps({"machine_identical": check["identical"], "seed_noise": noise, "n_opt_at_3e13": n_opt,
                      "held_out": [(h["run"], round(h["relative_error"], 4), h["inside_interval"])
                                   for h in held_out]}, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
