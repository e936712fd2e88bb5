"""Scores every finished run of a sweep on its whole validation split, one window batch at a time.

    python experiments/eval_noise/reeval.py SWEEP_DIR OUT.csv [CHUNK_BYTES]

For each run (a directory with ``final.json`` and checkpoints) it restores the newest parameters, read-only,
and writes one row: the recorded loss, the loss on the first ``train.eval_tokens`` tokens (the same windows the
run was scored on: must match), on the whole split, and on each disjoint chunk of CHUNK_BYTES (default: the
run's ``eval_tokens``). Byte-level runs only (a token is a byte).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.train.dataset import prepare_dataset
from jaxformer.train.loader import eval_batches
from jaxformer.train.matmul_choice import choose_kernels
from jaxformer.train.optimizer import make_optimizer
from jaxformer.train.restore import load_run_config, restore_params
from jaxformer.train.step import build_state, next_token_loss


_PROGRAMS: dict = {}  # (graphdef, dtype) -> the compiled pass: runs of one shape share it


def batch_losses(config, params, batches_ABW: np.ndarray) -> np.ndarray:
    """``[A]`` mean cross-entropy (nats/byte) of each batch of windows."""
    graphdef, _ = jax.eval_shape(lambda: build_state(config.model, 0, make_optimizer(config.optimizer),
                                                     config.kernel))
    dtype = jnp.dtype(config.train.compute_dtype)
    if (graphdef, dtype) not in _PROGRAMS:
        _PROGRAMS[graphdef, dtype] = jax.jit(lambda p, b: jax.lax.map(
            lambda w: next_token_loss(graphdef, p, w, dtype, drop_tokens=False)[1], b))
    return np.asarray(_PROGRAMS[graphdef, dtype](params, jnp.asarray(batches_ABW)))


def score(run_dir: Path, chunk_bytes: int | None) -> dict:
    config, _, _ = choose_kernels(load_run_config(run_dir))  # `auto` resolved as the run resolved it (cached)
    record = json.loads((run_dir / "final.json").read_text())
    train = config.train
    dataset = prepare_dataset(config)
    _, params = restore_params(run_dir, config)
    # batches of `micro_batch` windows, as the run's own pass: its first eval_tokens are the first batches here
    batches = eval_batches(dataset.val, train.seq_len, config.micro_batch, len(dataset.val))
    losses = batch_losses(config, params, batches)
    tokens_per_batch = batches.shape[1] * train.seq_len
    first = max(1, train.eval_tokens // tokens_per_batch)
    per_chunk = max(1, (chunk_bytes or train.eval_tokens) // tokens_per_batch)
    chunks = [losses[i:i + per_chunk].mean() for i in range(0, len(losses) - per_chunk + 1, per_chunk)]
    return {"run": run_dir.name, "N": record["params"], "D": record["tokens"], "C": record["flops_exact"],
            "loss_recorded": record["val_loss"], "loss_first": float(losses[:first].mean()),
            "loss_full": float(losses.mean()), "val_bytes": int(losses.size * tokens_per_batch),
            "chunks": json.dumps([round(float(c), 6) for c in chunks])}


def main(sweep_dir: str, out: str, chunk_bytes: str | None = None) -> None:
    runs = sorted(p.parent for p in Path(sweep_dir).glob("**/final.json") if (p.parent / "checkpoints").is_dir())
    rows = []
    for run_dir in runs:
        row = score(run_dir, int(float(chunk_bytes)) if chunk_bytes else None)
        rows.append(row)
        print(f"{row['run']}: recorded {row['loss_recorded']:.5f} first {row['loss_first']:.5f} "
              f"whole {row['loss_full']:.5f}", flush=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main(*sys.argv[1:])
