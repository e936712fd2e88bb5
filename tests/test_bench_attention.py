"""`jaxformer bench attention` at toy sizes: the report's structure and the memory search's refusals.

These check what the benchmark reports, not how fast anything is.
"""

import json
import statistics
import subprocess
import sys

import numpy as np
import pytest

from jaxformer import cli
from jaxformer.benchmarks.attention_memory import largest_n

SHAPE = {"batch": 1, "heads": 2, "head_dim": 8, "block_size": 32, "causal": True}


@pytest.mark.slow
def test_bench_attention_writes_timings_slopes_memory_and_plot(tmp_path, capsys, monkeypatch):
    from jaxformer.benchmarks import attention

    drawn, save_figure = [], attention.save_figure

    def read_then_save(fig, axes, path):  # what the figure draws, read as it is saved (the real save follows)
        drawn.extend([(line.get_label(), list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines]
                     for ax in axes)
        save_figure(fig, axes, path)

    monkeypatch.setattr(attention, "save_figure", read_then_save)
    code = cli.main(["bench", "attention", "--out", str(tmp_path), "--min-n", "32", "--max-n", "64",
                     "--repeats", "2", "--impls", "naive,blockwise", "--modes", "forward", "--heads", "2",
                     "--head-dim", "8", "--block-size", "32", "--fit-min-n", "32", "--memory-impls", "blockwise",
                     "--memory-start-n", "64", "--memory-max-n", "64", "--memory-budget-gb", "2"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "blockwise/naive" in printed and "largest n = 64" in printed
    report = json.loads((tmp_path / "attention.json").read_text())
    assert sorted((r["n"], r["impl"]) for r in report["timings"]) == [(32, "blockwise"), (32, "naive"), (64, "blockwise"), (64, "naive")]
    assert all(len(r["samples_s"]) == 2 and r["median_s"] > 0 for r in report["timings"])
    median = {}
    for r in report["timings"]:  # the figures are the samples' median and minimum
        assert (r["median_s"], r["min_s"]) == (statistics.median(r["samples_s"]), min(r["samples_s"]))
        median[r["n"], r["impl"]] = r["median_s"]
    for impl in ("naive", "blockwise"):  # the log-log slope of the medians from n = 32 to 64, fitted over both
        slope = np.log(median[64, impl] / median[32, impl]) / np.log(2)
        assert report["slopes"][f"{impl}/forward"]["n"] == [64]
        assert report["slopes"][f"{impl}/forward"]["local"] == [pytest.approx(slope, rel=1e-9)]
        assert report["slopes"][f"{impl}/forward"]["fitted"] == pytest.approx(slope, rel=1e-9)
    table = printed[printed.index("blockwise/naive"):printed.index("fitted exponent")].splitlines()[2:]
    rows = [line.split("|") for line in table]
    assert [int(cells[0]) for cells in rows] == [32, 64]
    assert [float(cells[-1]) for cells in rows] == [round(median[n, "blockwise"] / median[n, "naive"], 2)
                                                    for n in (32, 64)]  # the blockwise/naive column
    assert [float(cells[2].split("[")[1].rstrip("] ")) for cells in rows[1:]] == [
        round(np.log(median[64, "blockwise"] / median[32, "blockwise"]) / np.log(2), 2)]
    (search,) = report["memory"]
    assert (search["impl"], search["largest_n"], search["limited_by"]) == ("blockwise", 64, "none")
    (probe,) = search["probes"]
    assert probe["status"] == "ok" and probe["planned_bytes"] > 0 and probe["peak_added_bytes"] >= 0
    assert (tmp_path / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    times, memory = drawn  # each implementation's medians against n; the probe's measured and planned MiB
    assert times == [(f"{impl} forward", [32, 64], [median[32, impl], median[64, impl]])
                     for impl in ("naive", "blockwise")]
    assert memory == [("blockwise train: peak RSS rise", [64], [probe["peak_added_bytes"] / 2**20]),
                      ("blockwise: XLA plan", [64], [probe["planned_bytes"] / 2**20]),
                      ("one fp32 score tensor", [64], [1 * 2 * 64 * 64 * 4 / 2**20])]  # B·H·n² floats


@pytest.mark.slow
def test_memory_search_names_memory_when_the_plan_exceeds_the_budget():
    search = largest_n("naive", "train", start_n=256, max_n=1024, budget_bytes=2**20, time_budget_s=120,
                       total_time_s=300, shape=SHAPE)
    assert (search["largest_n"], search["limited_by"]) == (None, "memory")
    assert "n = 256: XLA plans" in search["detail"] and "> budget 0.00 GiB" in search["detail"]


@pytest.mark.slow
def test_memory_search_names_time_then_keeps_checking_the_plan():
    search = largest_n("blockwise", "train", start_n=64, max_n=128, budget_bytes=2**30, time_budget_s=60,
                       total_time_s=0, shape=SHAPE)
    assert (search["largest_n"], search["limited_by"], search["plan_fits_up_to"]) == (None, "time", 128)
    assert search["detail"] == "total time budget 0 s spent before n = 64"
    assert [(p["n"], p["status"]) for p in search["probes"]] == [(64, "planned"), (128, "planned")]


def test_bad_impl_is_one_line_exit_2():
    done = subprocess.run([sys.executable, "-m", "jaxformer.cli", "bench", "attention", "--impls", "naive,flash"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("jaxformer bench: error: --impls must be a comma-separated subset of "
                                   "naive,blockwise,xla,fused, got 'flash'")
