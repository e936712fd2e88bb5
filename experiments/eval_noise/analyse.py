"""The rule's numbers from `reeval.py`'s table and the sweep's results: residual RMS about each loss's own law.

    python experiments/eval_noise/analyse.py REEVAL.csv RESULTS.csv OUT_DIR [BOOTSTRAP]

Writes ``OUT_DIR/results_whole.csv`` (the sweep's table with each run's loss on the whole validation split),
fits Approach 3 (and 2) to both tables with ``jaxformer fit``'s library, and prints for each: a with its interval,
E, and the RMS of log(loss / law). Then the chunks: how much a run's loss on one 32 KB chunk departs from its
whole-split loss beyond what that chunk does to every run (the run's own share of the sampling noise).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np

from jaxformer.scaling.parametric import residuals
from jaxformer.scaling.report import fit_table
from jaxformer.scaling.table import load_table


def fit(path: Path, resamples: int) -> dict:
    """Approaches 3 and 2 as the main job fits them (Approach 2 resampling the pooled residuals)."""
    table = load_table(path)
    report = fit_table(table, "all", resamples=resamples, seed=0, resample2="residuals")
    fitted = report.to_dict()
    third, second = fitted["approach3"], fitted.get("approach2") or {}
    stats = third["bootstrap"]["stats"] if third["bootstrap"] else {}
    return {"a": third["a"], "a_ci": stats.get("a", {}).get("ci"), "E": third["params"]["E"],
            "E_ci": stats.get("E", {}).get("ci"),
            "rms": float(np.sqrt(np.mean(residuals(report.approach3.law, report.table) ** 2))),
            "a2": second.get("power_laws", {}).get("a"),
            "a2_ci": (second.get("bootstrap") or {}).get("a", {}).get("ci")}


def main(reeval: str, results: str, out_dir: str, resamples: str = "200") -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scored = {row["run"]: row for row in csv.DictReader(open(reeval))}
    rows = list(csv.DictReader(open(results)))
    done = [r for r in rows if r["status"] == "done"]
    for r in done:
        check = abs(float(scored[r["run"]]["loss_first"]) / float(r["loss"]) - 1)
        assert check < 1e-4, f"{r['run']}: rescored first windows differ from the recorded loss by {check:.2e}"
    whole = out / "results_whole.csv"
    with open(whole, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({**r, "loss": scored[r["run"]]["loss_full"]} for r in done)
    recorded = out / "results_recorded.csv"
    with open(recorded, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(done)
    summary = {name: fit(path, int(resamples)) for name, path in (("recorded", recorded), ("whole", whole))}

    # chunk noise: e_ik = log(loss_ik / loss_i,whole) minus that chunk's mean over runs
    names = [r["run"] for r in done]
    chunks = np.array([json.loads(scored[n]["chunks"]) for n in names])
    ratio = np.log(chunks / np.array([float(scored[n]["loss_full"]) for n in names])[:, None])
    own = ratio - ratio.mean(axis=0, keepdims=True)
    first_vs_whole = np.log(np.array([float(scored[n]["loss_first"]) / float(scored[n]["loss_full"]) for n in names]))
    summary["chunks"] = {"count": int(chunks.shape[1]), "runs": len(names),
                         "own_rms": float(np.sqrt(np.mean(own ** 2))),
                         "common_spread": float(np.std(ratio.mean(axis=0))),
                         "first_minus_whole_mean": float(first_vs_whole.mean()),
                         "first_minus_whole_own_rms": float(np.std(first_vs_whole))}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
