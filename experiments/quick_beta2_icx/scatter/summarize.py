"""Seed scatter per (size, budget) for each setting of the scatter check: mean loss and the seeds' relative SD.

Run from this directory: python summarize.py > summary.txt
"""

import collections
import csv
import math
import statistics

SETTINGS = {"lr1.0": "beta2 0.95, lr rule x1 (the main job)", "lr0.5": "beta2 0.95, lr rule x0.5",
            "b2_0.99": "beta2 0.99, lr rule x1", "b2_0.999": "beta2 0.999, lr rule x1"}

for name, label in SETTINGS.items():
    cells = collections.defaultdict(list)
    for row in csv.DictReader(open(f"results_{name}.csv")):
        cells[(int(row["N"]), float(row["budget"]))].append(float(row["loss"]))
    print(f"{name}: {label}")
    relative_variances = []
    for (n, budget), losses in sorted(cells.items()):
        mean = statistics.mean(losses)
        sd = statistics.stdev(losses) / mean
        relative_variances.append(sd**2)
        print(f"  N={n:>6} C={budget:.2g}  mean {mean:.4f}  seed SD {100 * sd:.2f}%  "
              + " ".join(f"{loss:.4f}" for loss in losses))
    print(f"  pooled seed SD {100 * math.sqrt(statistics.mean(relative_variances)):.2f}%\n")
