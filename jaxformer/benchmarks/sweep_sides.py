"""What each side of `jaxformer bench sweep` did, read after it finished: time breakdowns, the training-step
shares and FLOP/s against the matmul peak, from jaxformer's run directories and from the twin's report."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from jaxformer.benchmarks.replay import replay_plan


def jax_side(sweep_dir: Path, wall_s: float, workers: int) -> dict:
    """Time breakdown, shares and FLOP/s of a finished jaxformer sweep directory (every run of `replay_plan`).

    A run's busy time is the sum of its ``final.json["time"]`` parts (``startup_s``, the
    process's start-up, is counted by the first run of each warm worker process and lies
    outside ``total_s``; whichever of ``total_s`` and the sum is larger is taken). Without a
    ``time`` section: the executor's status ``wall_s`` (else ``final.json``'s), of which
    ``compile_s`` and ``tokens / tokens_per_s`` are compile and train time. A branch's FLOPs are those of
    its steps after the fork (its ``final.json`` counts the whole run, trunk included).
    """
    sums: dict[str, float] = {}
    flops, peaks, sources, count, val_loss = 0.0, [], set(), 0, {}
    for directory, name in [(run.directory, run.name) for stage in replay_plan(sweep_dir) for run in stage]:
        final_path = directory / "runs" / name / "final.json"
        if not final_path.is_file():
            continue
        count += 1
        final = json.loads(final_path.read_text())
        fork_path = directory / "runs" / name / "fork.json"
        fork_step = json.loads(fork_path.read_text())["step"] if fork_path.is_file() else 0
        breakdown = final.get("time")
        if isinstance(breakdown, dict) and "train_s" in breakdown:
            sources.add("final.json 'time' sections")
            parts = {key: float(value) for key, value in breakdown.items()
                     if isinstance(value, (int, float)) and key != "total_s"}
            busy = max(float(breakdown.get("total_s", 0.0)), sum(parts.values()))
        else:
            status_path = directory / "status" / f"{name}.json"
            status = json.loads(status_path.read_text()) if status_path.is_file() else {}
            if isinstance(status.get("wall_s"), (int, float)) and status["wall_s"] > 0:
                busy = float(status["wall_s"])
                sources.add("no 'time' section in final.json: busy = the executor's status wall_s")
            else:
                busy = float(final["wall_s"])
                sources.add("no 'time' section in final.json: busy = final.json wall_s")
            sources.add("train = tokens / tokens_per_s, compile = compile_s (final.json)")
            parts = {"compile_s": float(final["compile_s"]), "train_s": final["tokens"] / final["tokens_per_s"]}
        parts["other_s"] = parts.get("other_s", 0.0) + busy - sum(parts.values())
        for key, value in parts.items():
            sums[key] = sums.get(key, 0.0) + value
        sums["busy_s"] = sums.get("busy_s", 0.0) + busy
        flops += float(final["flops_exact"]) * (final["steps"] - fork_step) / final["steps"]
        peaks.append(float(final["peak_flops"]))
        val_loss[name] = final.get("val_loss")
    result = _figures(count, sums, wall_s, workers, flops, statistics.median(peaks) if peaks else None,
                      sorted(sources))
    result["val_loss"] = val_loss
    return result


def torch_side(report: dict, wall_s: float, workers: int, peak: float | None) -> dict:
    """The same figures for the twin's report (``torch_sweep.run_plan``).

    Busy time: each worker's start-up (from the pool's start to ready: spawn, PyTorch
    imports) counted as ``startup_s``, plus every run's ``total_s``.
    """
    sums: dict[str, float] = {"startup_s": sum(report["worker_ready_s"])}
    for record in report["runs"]:
        parts = {key: value for key, value in record["time"].items() if key != "total_s"}
        parts["other_s"] = record["time"]["total_s"] - sum(parts.values())
        for key, value in parts.items():
            sums[key] = sums.get(key, 0.0) + value
    sums["busy_s"] = sum(value for key, value in sums.items())
    flops = sum(record["flops_exact"] for record in report["runs"])
    result = _figures(len(report["runs"]), sums, wall_s, workers, flops, peak,
                      ["the twin's worker start-up and per-run time sections"])
    # the twin's parent plans and prepares the data with jaxformer's code (importing JAX) while the workers
    # start; what of that a PyTorch-only script would not pay is at most the wait past the first ready worker
    first_ready = min(report["worker_ready_s"], default=0.0)
    result.update(internal_wall_s=report["wall_s"], prepare_s=report["prepare_s"],
                  prepare_past_first_ready_s=max(0.0, report["prepare_s"] - first_ready),
                  worker_ready_s=report["worker_ready_s"], threads=report["threads"],
                  torch_matmul_peak_flops=report["matmul_peak_flops"], torch_matmul_peak_dtype=report["matmul_peak_dtype"],
                  steps=[record["steps"] for record in report["runs"]],
                  optimizer_steps=[record["optimizer_steps"] for record in report["runs"]],
                  val_loss={record["name"]: record["val_loss"] for record in report["runs"]})
    return result


def _figures(count: int, sums: dict, wall_s: float, workers: int, flops: float, peak: float | None,
             sources: list[str]) -> dict:
    capacity = wall_s * workers
    per_worker = flops / capacity
    train_s = sums.get("train_s", 0.0)
    return {
        "runs": count, "wall_s": wall_s, "sums_s": sums, "time_source": sources,
        "train_share_of_busy": train_s / sums["busy_s"] if sums.get("busy_s") else None,
        "train_share_of_capacity": train_s / capacity,
        "flops_exact": flops, "flops_per_s": flops / wall_s, "flops_per_s_per_worker": per_worker,
        "peak_flops_per_worker": peak, "utilization": per_worker / peak if peak else None,
        "train_flops_per_s_per_worker": flops / train_s if train_s else None,
        "train_mfu": flops / train_s / peak if train_s and peak else None,
    }
