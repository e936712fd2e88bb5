"""Seed 3's four runs (jaxformer and PyTorch, fp32 and bf16) against jaxformer's fp32 run: the relative difference of
each 20-step mean training loss, written to seed3.png.

    python experiments/bf16_curve_zen4_session30/seed3_figure.py
"""

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bf16_curve"))  # a folder of scripts, not a package
from compare import series  # noqa: E402

RUNS = {"jaxformer bf16": "jax_bf16_onednn_fused_seed3", "PyTorch fp32": "torch_fp32_seed3",
        "PyTorch bf16 autocast": "torch_bf16_autocast_seed3"}

reference = series(HERE / "runs" / "jax_fp32_onednn_fused_seed3", "train_loss")
fig, ax = plt.subplots(figsize=(8, 4))
for label, name in RUNS.items():
    other = series(HERE / "runs" / name, "train_loss")
    steps = sorted(set(reference) & set(other))
    ax.plot(steps, [100 * (other[s] - reference[s]) / reference[s] for s in steps], label=label)
ax.axhline(1, color="grey", ls=":"), ax.axhline(-1, color="grey", ls=":"), ax.axhline(0, color="black", lw=0.5)
ax.set_xlabel("step"), ax.set_ylabel("train loss − jaxformer fp32 (%)"), ax.set_title("seed 3"), ax.legend()
fig.tight_layout()
fig.savefig(HERE / "seed3.png", dpi=100)
