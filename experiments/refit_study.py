"""Refits a committed study from its results.csv and its spec.yaml's ``fit:``, as its sweep's closing fit does
(`jaxformer.sweep.fit.fit_and_write`): fit.json and the figures in the study's folder, and
the printed fit in refit_log.txt (fit_log.txt stays the log of the sweep itself).

    python experiments/refit_study.py experiments/cpu_chinchilla [...]

For when the analysis changes after the runs were trained; the runs and their results are not touched.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from jaxformer.configs import from_dict, load_yaml
from jaxformer.scaling.table import load_table
from jaxformer.sweep.fit import fit_and_write
from jaxformer.sweep.spec import FitSpec


def refit(study: Path) -> str:
    # the fit: section alone: a tuned study's spec.yaml holds its tune: beside the rule it fitted, which a launch
    # would refuse, and the runs are not planned again here
    fit = from_dict(FitSpec, load_yaml(study / "spec.yaml").get("fit"), prefix="fit")
    with (study / "results.csv").open(newline="") as handle:
        done = [row for row in csv.DictReader(handle) if row["status"] == "done"]
    table = load_table(study / "results.csv", group_by=fit.bootstrap_groups)
    text, _ = fit_and_write(table, done, fit, study)
    for figure in study.glob("*.svg"):  # the studies keep the PNGs only
        figure.unlink()
    (study / "refit_log.txt").write_text(text.lstrip("\n") + "\n")
    return text


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        print(refit(Path(folder)))
