"""Compares two runs' loss curves (fp32 and bf16 compute, or any two): per logged step, the relative difference of
the training loss (mean over each logging interval) and of each evaluation; writes compare.json and curve.png.

    python experiments/bf16_curve/compare.py RUN_FP32 RUN_BF16 OUT_DIR [--names fp32 bf16]

A run is a run directory (its metrics.jsonl and final.json), or this folder's copies:
``python experiments/bf16_curve/compare.py fp32 bf16 OUT`` reads ``fp32_metrics.jsonl`` and ``fp32_final.json``.
``--names`` labels the two runs in the report's keys and the figure (default ``fp32 bf16``).
"""

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


HERE = Path(__file__).resolve().parent


def _file(run: Path, name: str) -> Path:
    """``run/name``, or this folder's copy ``<run>_<name>`` when ``run`` is not a directory."""
    return run / name if run.is_dir() else HERE / f"{run.name}_{name}"


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in _file(run, "metrics.jsonl").read_text().splitlines() if line.strip()]


def series(run: Path, key: str) -> dict[int, float]:
    return {row["step"]: row[key] for row in rows(run) if key in row}


def main(fp32: Path, bf16: Path, out: Path, names: tuple[str, str] = ("fp32", "bf16")) -> None:
    first, second = names
    out.mkdir(parents=True, exist_ok=True)
    report = {}
    for key in ("train_loss", "val_loss"):
        a, b = series(fp32, key), series(bf16, key)
        steps = sorted(set(a) & set(b))
        rel = [(b[s] - a[s]) / a[s] for s in steps]
        late = [r for s, r in zip(steps, rel) if s > steps[-1] // 2]
        report[key] = {"points": len(steps), "max_abs_rel_diff": max(map(abs, rel)),
                       "max_abs_rel_diff_second_half": max(map(abs, late)),
                       "median_abs_rel_diff": statistics.median(map(abs, rel)),
                       "beyond_1_percent": [[s, r] for s, r in zip(steps, rel) if abs(r) > 0.01],
                       f"final_{first}": a[steps[-1]], f"final_{second}": b[steps[-1]], "final_rel_diff": rel[-1]}
    finals = {name: json.loads(_file(run, "final.json").read_text()) for name, run in ((first, fp32), (second, bf16))}
    report["train_s"] = {name: final["time"]["train_s"] for name, final in finals.items()}
    (out / "compare.json").write_text(json.dumps(report, indent=2) + "\n")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for name, run in ((first, fp32), (second, bf16)):
        curve = series(run, "train_loss")
        top.plot(list(curve), list(curve.values()), label=name)
    a, b = series(fp32, "train_loss"), series(bf16, "train_loss")
    steps = sorted(set(a) & set(b))
    bottom.plot(steps, [100 * (b[s] - a[s]) / a[s] for s in steps])
    bottom.axhline(1, color="grey", ls=":"), bottom.axhline(-1, color="grey", ls=":")
    top.set_ylabel("train loss (nats/byte)"), top.legend()
    bottom.set_ylabel(f"{second} − {first} (%)"), bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=100)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Compares two runs' loss curves.")
    parser.add_argument("fp32", type=Path)
    parser.add_argument("bf16", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--names", nargs=2, default=("fp32", "bf16"))
    args = parser.parse_args()
    main(args.fp32, args.bf16, args.out, tuple(args.names))
