"""`jaxformer bench sweep SPEC`: a whole sweep trained by jaxformer and by a PyTorch twin, side by side.

In one invocation, on the same machine, one after the other (jaxformer first, then the order
alternates between ``--repeats``):

- jaxformer as a user runs it: ``python -m jaxformer.cli sweep SPEC --out DIR`` in a
  subprocess, timed from outside (interpreter start-up, planning, the tuning stage, every run,
  the adapt rounds, the results table). The spec is run from a copy without its ``fit`` section
  (the twin fits nothing; ``--with-fit`` keeps it); ``--cold`` also points
  ``base.train.compilation_cache`` and ``base.data.token_cache`` at fresh directories, so every
  train step is compiled, and a BPE corpus tokenised, from scratch.
- the PyTorch twin of the same runs (`jaxformer.benchmarks.torch_sweep`): it replays what the
  first jaxformer sweep trained (its tuning runs, the main runs at their tuned learning rates, the
  adapt-added sizes, trunks and cooldown branches), with identical shapes, steps, batches, AdamW
  and learning-rate schedules, on the same number of long-lived worker processes with as many
  threads each, timed from outside the same way. Its learning-rate arrays (jaxformer's
  `learning_rates`) are computed beforehand, outside both timings, and handed over
  (``schedules_s`` says how long they took: jaxformer's runs pay that inside their own time).

Reported: both wall times and their ratio (torch / jaxformer: jaxformer's speedup);
jaxformer's training-step share of worker time, two ways — ``Σ train_s / Σ busy_s`` (busy:
every second a run accounts for, its worker process's start-up included, see `jaxformer.benchmarks.sweep_sides.jax_side`) and
``Σ train_s / (wall × workers)`` (the machine's capacity); and the sweep's achieved FLOP/s:
the runs' exact training FLOPs (``flops_exact`` of each ``final.json``) over ``wall × workers``,
per worker, against the per-worker matmul peak (``peak_flops`` of ``final.json``, as measured
for a run's process layout; median over runs), and the same FLOPs over ``Σ train_s`` ("in
train": the MFU of the train steps alone). The same figures are given for the twin, against the same peak.

A run's time breakdown is read from ``final.json``'s ``time`` section when it has one;
without it, train time is ``tokens / tokens_per_s``, compile time ``compile_s``, and the
output says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jaxformer.arguments import integer
from jaxformer.benchmarks.environment import environment, package_version
from jaxformer.benchmarks.outputs import output_directory, output_file
from jaxformer.benchmarks.replay import replay_plan
from jaxformer.benchmarks.sweep_sides import jax_side, torch_side
from jaxformer.files import write_json_atomic

# written into each out/r{i} this benchmark makes: only a directory holding it is emptied for a new repeat
MARKER = ".jaxformer-bench-sweep"


class ChildFailed(Exception):
    """A timed side's process exited with a non-zero ``status``; the message names it and its log."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="sweep YAML (see sweeps/)")
    parser.add_argument("--out", help="keep both sweeps here, with bench_sweep.json (default: a temporary directory)")
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--workers", type=int,
                        help="parallel runs on both sides (default: the layout `jaxformer sweep` chooses)")
    parser.add_argument("--skip-torch", action="store_true", help="time jaxformer only")
    parser.add_argument("--cold", action="store_true", help="jaxformer with empty compilation and token caches")
    parser.add_argument("--repeats", type=integer(1), default=1, help="repeat both, alternating which goes first")
    parser.add_argument("--with-fit", action="store_true", help="keep the spec's fit (jaxformer's wall includes it)")
    parser.add_argument("--torch-checkpoints", action="store_true",
                        help="the twin saves model and optimizer at checkpoint.interval steps, as jaxformer does")


# --- the two sides ---

def _layout(workers: int | None) -> tuple[int, int]:
    """``(processes, threads)`` `jaxformer sweep` trains with (its own choice unless ``--workers``)."""
    try:
        from jaxformer.sweep.launch import choose_layout

        processes, threads, _ = choose_layout(workers, None)
    except ImportError:
        processes, threads = workers or os.cpu_count() or 1, 1
    return processes, threads


def write_spec_copy(spec: Path, path: Path, *, keep_fit: bool, cache: Path | None) -> None:
    """``spec`` as ``path``: its name kept, ``fit`` dropped unless ``keep_fit``; the compilation cache at ``cache``
    and the token cache beside it."""
    import yaml

    from jaxformer.configs import load_yaml

    data = load_yaml(spec)
    data.setdefault("name", spec.stem)
    if not keep_fit:
        data.pop("fit", None)
    if cache is not None:
        base = data.setdefault("base", {}) or {}
        data["base"] = base
        base["train"] = {**(base.get("train") or {}), "compilation_cache": str(cache)}
        base["data"] = {**(base.get("data") or {}), "token_cache": str(cache.with_name("token-cache"))}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _timed(command: list[str], log: Path, what: str) -> float:
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w") as handle:
        handle.write(f"$ {' '.join(command)}\n")
        handle.flush()
        process = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=os.getcwd())
    wall = time.perf_counter() - started
    if process.returncode != 0:
        tail = " | ".join(log.read_text().strip().splitlines()[-3:])
        raise ChildFailed(f"{what} exited with status {process.returncode} (its log: {log}): {tail}",
                          process.returncode)
    return wall


def _cache_entries(path: str) -> int | None:
    if not path:
        return None
    directory = Path(path).expanduser()
    return sum(1 for _ in directory.rglob("*") if _.is_file()) if directory.is_dir() else 0


# --- the benchmark ---

def run(args: argparse.Namespace) -> int:
    from jaxformer.sweep.plan import plan_runs
    from jaxformer.sweep.spec import load_spec
    from jaxformer.sweep.tune import plan_tuning
    from jaxformer.train.config import config_from_dict

    if args.repeats < 1:
        raise ValueError(f"--repeats must be positive, got {args.repeats}")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be positive, got {args.workers}")
    spec_path = Path(args.spec)
    spec = load_spec(spec_path)
    planned = plan_runs(spec) + (plan_tuning(spec) if spec.tune is not None else [])
    if not args.skip_torch:
        if package_version("torch") is None:
            raise ValueError("the PyTorch twin needs torch installed (or pass --skip-torch)")
        from jaxformer.benchmarks.torch_twin import check_supported

        check_supported(planned)  # refuses, in one line, a run the twin cannot train, before anything starts
    json_path = output_file(args.json, "--json")
    out = output_directory(args.out, "--out")
    if out is not None:
        output_file(out / "bench_sweep.json", "--out")
        check_repeat_directories(out, args.repeats)
    temporary = out is None
    out = out or Path(tempfile.mkdtemp(prefix="jaxformer-bench-sweep-"))
    workers, threads = _layout(args.workers)
    torch_threads = threads or os.cpu_count() or 1
    cache_setting = config_from_dict(dict(spec.base)).train.compilation_cache
    started_load = os.getloadavg()
    report = {"spec": str(spec_path), "name": spec.name, "planned_runs": len(planned), "workers": workers,
              "threads": threads, "torch_threads": torch_threads, "cold": args.cold, "with_fit": args.with_fit,
              "torch_checkpoints": args.torch_checkpoints, **environment(),
              "load_average_before": started_load,
              "repeats": []}
    print(f"bench sweep {spec.name}: {len(planned)} planned runs on {workers} workers × {threads or 'all'} threads, "
          f"{report['cpu_model']}, load {' '.join(f'{x:.2f}' for x in started_load)}, "
          f"compilation cache {'cold' if args.cold else 'as configured'}", flush=True)
    failed = None
    try:
        for repeat in range(args.repeats):
            report["repeats"].append(_repeat(args, spec_path, out, repeat, workers, threads, torch_threads,
                                             cache_setting, report))
    except ChildFailed as error:
        failed = error
    finally:
        if temporary and failed is None:
            shutil.rmtree(out, ignore_errors=True)
    if failed is not None:  # its log is kept (in a temporary directory too): the message names it
        print(f"jaxformer bench: error: {failed}", file=sys.stderr)
        return 2 if failed.status == 2 else 1
    report["load_average_after"] = os.getloadavg()
    _summarise(report)
    _print(report)
    for path in (json_path, None if temporary else out / "bench_sweep.json"):
        if path is not None:
            write_json_atomic(path, report, indent=1)
    return 0


def check_repeat_directories(out: Path, repeats: int) -> None:
    """``ValueError`` naming ``--out`` when a repeat's directory ``out/r{i}`` is a file, or holds files and was not
    made by this benchmark (it has no `MARKER`): each repeat empties its directory first."""
    for repeat in range(repeats):
        directory = out / f"r{repeat}"
        if directory.exists() and not directory.is_dir():
            raise ValueError(f"--out {out}: r{repeat} is a file, and bench sweep writes repeat {repeat} there")
        if directory.is_dir() and any(directory.iterdir()) and not (directory / MARKER).is_file():
            raise ValueError(f"--out {out}: r{repeat} holds files bench sweep did not write, and it would replace "
                             f"them; pick another --out")


def _repeat(args, spec_path: Path, out: Path, repeat: int, workers: int, threads: int, torch_threads: int,
            cache_setting: str, report: dict) -> dict:
    """One repeat in ``out/r{repeat}`` (emptied first: `check_repeat_directories` made sure it is this benchmark's):
    jaxformer's sweep and the twin's replay of the first one (``out/r0/jax``).

    After the first jaxformer sweep the twin's learning-rate arrays are computed, outside both timings,
    into ``out/r0/schedules.npz`` (``report["schedules_s"]``): made anew with ``r0``, never an earlier run's."""
    directory = out / f"r{repeat}"
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    (directory / MARKER).write_text("made by jaxformer bench sweep: emptied by its next run with this --out\n")
    cache = directory / "xla-cache" if args.cold else None
    spec_copy = directory / "spec.yaml"
    write_spec_copy(spec_path, spec_copy, keep_fit=args.with_fit, cache=cache)
    order = ["jax", "torch"] if repeat % 2 == 0 else ["torch", "jax"]
    if args.skip_torch:
        order = ["jax"]
    result = {"order": order, "load_average_before": os.getloadavg(),
              "compilation_cache": str(cache) if cache else cache_setting,
              "cache_entries_before": _cache_entries(str(cache) if cache else cache_setting)}
    replayed, schedules = out / "r0" / "jax", out / "r0" / "schedules.npz"
    for side in order:
        if side == "jax":
            # the layout is passed even when it is the default, so both sides surely use the same one
            command = [sys.executable, "-m", "jaxformer.cli", "sweep", str(spec_copy), "--out", str(directory / "jax"),
                       "--workers", str(workers), "--threads", str(threads)]
            print(f"[{repeat}] jaxformer sweep …", flush=True)
            wall = _timed(command, directory / "jax.log", "jaxformer sweep")
            result["jax"] = jax_side(directory / "jax", wall, workers)
            print(f"[{repeat}] jaxformer: {wall:.1f}s", flush=True)
        else:
            if not schedules.is_file():
                from jaxformer.benchmarks.torch_twin import save_schedules

                started = time.perf_counter()
                save_schedules([run for stage in replay_plan(replayed) for run in stage], schedules)
                report["schedules_s"] = time.perf_counter() - started
            twin_json = directory / "torch.json"
            command = [sys.executable, "-m", "jaxformer.benchmarks.torch_sweep", str(replayed), "--workers",
                       str(workers), "--threads", str(torch_threads), "--json", str(twin_json),
                       "--schedules", str(schedules)]
            if args.torch_checkpoints:
                command += ["--checkpoints", str(directory / "torch-checkpoints")]
            print(f"[{repeat}] PyTorch twin …", flush=True)
            wall = _timed(command, directory / "torch.log", "the PyTorch twin")
            result["torch"] = json.loads(twin_json.read_text())
            print(f"[{repeat}] PyTorch twin: {wall:.1f}s", flush=True)
            result["torch_wall_s"] = wall
            result["torch"].update(_torch_matmul_peak(result["torch"]["runs"], torch_threads))
    if "torch" in result:
        twin = result.pop("torch")
        peak = result["jax"]["peak_flops_per_worker"]
        result["torch"] = torch_side(twin, result.pop("torch_wall_s"), workers, peak)
        result["ratio"] = result["torch"]["wall_s"] / result["jax"]["wall_s"]
    result["load_average_after"] = os.getloadavg()
    return result


def _torch_matmul_peak(runs: list[dict], threads: int) -> dict:
    """PyTorch's matmul peak with a twin worker's ``threads``, in the runs' compute dtype (bf16 where every run
    computed under bf16 autocast, else fp32), probed here, outside the twin's timed process: where the CPU has no
    fast path for the dtype (bf16 without AVX-512) the probe takes seconds that are not the twin's work."""
    import torch

    from jaxformer.benchmarks.torch_reference import matmul_peak

    dtype = "bfloat16" if all(run["autocast"] for run in runs) else "float32"
    torch.set_num_threads(threads)
    return {"matmul_peak_flops": matmul_peak(dtype, repeats=5), "matmul_peak_dtype": dtype}


def _summarise(report: dict) -> None:
    """Top-level figures: those of the repeat with the lower-median wall time, per side (one repeat: that one).

    The lower median is a measured repeat (of two, the faster), so each side's wall time, shares
    and FLOP/s come from one and the same sweep; the ratio is of those two wall times.
    """
    repeats = report["repeats"]
    report["runs"] = repeats[-1]["jax"]["runs"]
    for side in ("jax", "torch"):
        if side in repeats[-1]:
            report[f"{side}_wall_s"] = statistics.median_low(r[side]["wall_s"] for r in repeats)
            report[side] = next(r[side] for r in repeats if r[side]["wall_s"] == report[f"{side}_wall_s"])
    if "torch" in report:
        report["ratio"] = report["torch_wall_s"] / report["jax_wall_s"]


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _print(report: dict) -> None:
    sides = [("jaxformer", report["jax"])] + ([("PyTorch twin", report["torch"])] if "torch" in report else [])
    print(f"{'':<14}{'wall s':>8}{'runs':>6}{'train/busy':>12}{'train/cap':>11}{'GFLOP/s/worker':>16}{'of peak':>9}"
          f"{'in train':>10}")
    for label, side in sides:
        print(f"{label:<14}{side['wall_s']:>8.1f}{side['runs']:>6}{_share(side['train_share_of_busy']):>12}"
              f"{_share(side['train_share_of_capacity']):>11}{side['flops_per_s_per_worker'] / 1e9:>16.3f}"
              f"{_share(side['utilization']):>9}{_share(side['train_mfu']):>10}")
    if len(report["repeats"]) > 1:
        print("wall times per repeat: " + "; ".join(
            f"{'/'.join(r['order'])}: jax {r['jax']['wall_s']:.1f}s"
            + (f", torch {r['torch']['wall_s']:.1f}s" if "torch" in r else "") for r in report["repeats"]))
    for label, side in sides:
        sums = side["sums_s"]
        print(f"{label} worker time (Σ): busy {sums['busy_s']:.1f}s = " + ", ".join(
            f"{key[:-2]} {value:.1f}s" for key, value in sums.items() if key != "busy_s"))
    jax = report["jax"]
    print("jaxformer times from: " + "; ".join(jax["time_source"]))
    peak = jax["peak_flops_per_worker"]
    print(f"achieved FLOP/s = Σ flops_exact {jax['flops_exact']:.3g} / (wall × {report['workers']} workers); "
          f"peak per worker {peak / 1e9:.1f} GFLOP/s (the runs' compute dtype's matmul, final.json peak_flops, median)"
          if peak else "no peak_flops recorded")
    if "torch" in report:
        twin = report["torch"]
        print(f"PyTorch twin: preparation (plan, data, schedules) {twin['prepare_s']:.1f}s, workers ready at "
              + ", ".join(f"{s:.1f}s" for s in twin["worker_ready_s"])
              + f" (runs waited {twin['prepare_past_first_ready_s']:.1f}s for the preparation); "
              f"its {twin['threads']}-thread {twin['torch_matmul_peak_dtype']} matmul peak {twin['torch_matmul_peak_flops'] / 1e9:.1f} GFLOP/s")
        print(f"ratio torch wall / jaxformer wall = {report['ratio']:.2f} (jaxformer's speedup; > 1: jaxformer faster)")
