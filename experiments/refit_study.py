"""Refits a committed study from its results.csv and spec.yaml, as its sweep's closing fit does
(`jaxformer.sweep.fit.fit_and_write`): fit.json and the figures in the study's folder, and
the printed fit in refit_log.txt (fit_log.txt stays the log of the sweep itself).

    python experiments/refit_study.py experiments/cpu_chinchilla [...]

For when the analysis changes after the runs were trained; the runs and their results are not touched.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from jaxformer.scaling.table import load_table
from jaxformer.sweep.fit import fit_and_write
from jaxformer.sweep.spec import load_spec


def refit(study: Path) -> str:
    spec = load_spec(study / "spec.yaml")
    with (study / "results.csv").open(newline="") as handle:
        done = [row for row in csv.DictReader(handle) if row["status"] == "done"]
    table = load_table(study / "results.csv", group_by=spec.fit.bootstrap_groups)
    text, _ = fit_and_write(table, done, spec.fit, study)
    for figure in study.glob("*.svg"):  # the studies keep the PNGs only
        figure.unlink()
    (study / "refit_log.txt").write_text(text.lstrip("\n") + "\n")
    return text


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        print(refit(Path(folder)))
