"""`jaxformer bench train`'s PyTorch twin computes the same model as jaxformer, and the bench runs."""

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer.benchmarks.torch_reference import TorchDecoder, load_jax_params
from jaxformer.benchmarks.train import TORCH_BF16_FLOOR
from jaxformer.cli import main
from jaxformer.models import get_preset
from jaxformer.models.pure import apply, init_params
from jaxformer.train.peak import cpu_model


@pytest.mark.parametrize("changes", [{}, {"num_kv_heads": 2, "tie_embeddings": False}])
def test_torch_twin_matches_the_jax_decoder_logits(changes):
    """Bias-free RMSNorm/SwiGLU/RoPE (the `tiny` preset), with and without GQA and tying."""
    cfg = dataclasses.replace(get_preset("tiny"), num_layers=2, **changes)
    graphdef, params = init_params(cfg, seed=0)
    tokens = np.random.default_rng(0).integers(0, 256, (2, 16))
    logits_jax = np.asarray(apply(graphdef, params, jax.numpy.asarray(tokens))[0])
    twin = TorchDecoder(cfg)
    load_jax_params(twin, nnx.to_pure_dict(params))
    logits_torch = twin(torch.from_numpy(tokens)).detach().numpy()
    assert np.abs(logits_jax - logits_torch).max() < 1e-4


def test_bench_train_runs_and_reports_ratios(tmp_path, capsys):
    assert main(["bench", "train", "--sizes", "16:1:32", "--batch", "4", "--steps", "2", "--repeats", "1",
                 "--json", str(tmp_path / "b.json")]) == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert [row["dtype"] for row in report["sizes"]] == ["float32", "bfloat16"]  # both dtypes by default
    peaks = report["matmul_peaks"]
    bf16_peer = peaks["bfloat16"]["torch"] >= TORCH_BF16_FLOOR * peaks["float32"]["torch"]  # this CPU has bf16 units
    assert any("torch bf16 steps not timed" in note for note in report["notes"]) == (not bf16_peer)
    for row in report["sizes"]:
        assert row["params"] == 8240 and ("ratio" in row) == (row["dtype"] == "float32" or bf16_peer)
        if "ratio" in row:
            assert row["ratio"] == pytest.approx(row["jax_tokens_per_s"] / row["torch_tokens_per_s"])
        peak = peaks[row["dtype"]]
        assert 0 < row["jax_mfu"] < 1 and peak["jax"] > 1e8 and peak["torch"] > 1e6
        assert row["jax_mfu"] == pytest.approx(row["jax_tokens_per_s"] * row["flops_per_token"] / peak["jax"])
    assert report["cpu_model"] == cpu_model() and report["matmul_peak_flops"] == report["matmul_peaks"]["float32"]["jax"]
    assert report["attention_impl"] == "naive"
    # what the figures were measured with, as `bench sweep` records it
    assert report["jax_version"] == jax.__version__ and report["torch_version"] == torch.__version__
    assert report["cores"] == os.cpu_count() and set(report["variables"]) == {"GLIBC_TUNABLES", "XLA_FLAGS"}
    out = capsys.readouterr().out
    assert f"CPU: {cpu_model()}" in out and "ratio" in out and "matmul peak bfloat16" in out


def test_layout_compares_one_process_with_every_core_against_one_per_core_and_saves_the_faster(
        monkeypatch, tmp_path, capsys):
    """``--layout``: each layout's aggregate tokens/s from fresh `bench train` processes run side by side; the one
    with more saved for the sweep (one process per core where it wins at least half the sizes)."""
    monkeypatch.setattr("jaxformer.benchmarks.train.LAYOUT_FILE", tmp_path / "layout.json")
    assert main(["bench", "train", "--sizes", "16:1:32", "--batch", "2", "--steps", "2", "--repeats", "1",
                 "--no-torch", "--dtypes", "float32", "--layout", "--json", str(tmp_path / "b.json")]) == 0
    layout = json.loads((tmp_path / "b.json").read_text())["layout"]
    cores = os.cpu_count()
    measured = layout["tokens_per_s"]["16:1:32"]
    assert set(measured) == {f"1x{cores}", f"{cores}x1"} and min(measured.values()) > 0
    per_core = measured[f"{cores}x1"] > measured[f"1x{cores}"]
    assert layout["choice"] == ({"processes": cores, "threads": 1} if per_core else {"processes": 1, "threads": 0})
    assert json.loads((tmp_path / "layout.json").read_text()) == layout["choice"]
    assert f"sweep layout chosen: {layout['choice']}" in capsys.readouterr().out


def test_layout_names_the_command_that_failed(monkeypatch, tmp_path, capsys):
    """A measuring process that fails stops the comparison in one line naming it and its last words (it was a
    traceback), exit 1, nothing saved."""
    monkeypatch.setattr("jaxformer.benchmarks.train.LAYOUT_FILE", tmp_path / "layout.json")
    monkeypatch.setattr("jaxformer.sweep.executors.thread_environment",
                        lambda threads: {**os.environ, "JAX_PLATFORMS": "nonesuch"})
    assert main(["bench", "train", "--sizes", "16:1:32", "--batch", "2", "--steps", "2", "--repeats", "1",
                 "--no-torch", "--dtypes", "float32", "--layout"]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"jaxformer bench: error: --layout: `jaxformer bench train --sizes 16:1:32 --batch 2 --steps 2 "
                        r"--repeats 3 --no-torch --dtypes float32` with all threads exited with status 1: "
                        r".*nonesuch.*\n", err), err
    assert not (tmp_path / "layout.json").exists()


def test_alternating_sides_time_each_run_after_an_untimed_one(monkeypatch):
    """Where the JAX and PyTorch steps alternate, each timed run follows an untimed one of the same side (a side's
    first run after the other's pays for the memory that run churned); alone, nothing is run untimed."""
    from jaxformer.benchmarks import train as bench
    from jaxformer.train.throughput import TrainStepRunner

    calls, seconds = [], {"jax": [], "torch": []}  # each run's seconds, as the runs themselves report them
    real_run, real_torch_step = TrainStepRunner.run, bench.timed_torch_step

    def run(self, steps):
        calls.append(("jax", steps))
        seconds["jax"].append(real_run(self, steps))
        return seconds["jax"][-1]

    def torch_step(config):
        step = real_torch_step(config)

        def timed(steps):
            calls.append(("torch", steps))
            seconds["torch"].append(step(steps=steps))
            return seconds["torch"][-1]
        return timed

    monkeypatch.setattr(TrainStepRunner, "run", run)
    monkeypatch.setattr(bench, "timed_torch_step", torch_step)
    config = bench.bench_config(16, 1, 32, 4)
    row = bench.measure(config, steps=2, repeats=2, torch_too=True)
    assert calls == [("torch", 1)] + [("jax", 2), ("jax", 2), ("torch", 2), ("torch", 2)] * 2  # warm-up, then pairs
    assert row["ratio"] == pytest.approx(row["jax_tokens_per_s"] / row["torch_tokens_per_s"])
    tokens = 2 * 4 * 32  # steps × batch × seq_len, over the median of the timed runs (each after an untimed one)
    assert row["jax_tokens_per_s"] == pytest.approx(tokens / statistics.median(seconds["jax"][1::2]), rel=1e-12)
    assert row["torch_tokens_per_s"] == pytest.approx(tokens / statistics.median(seconds["torch"][2::2]), rel=1e-12)
    calls.clear()
    seconds["jax"].clear()
    row = bench.measure(config, steps=2, repeats=3, torch_too=False)
    assert calls == [("jax", 2)] * 3
    assert row["jax_tokens_per_s"] == pytest.approx(tokens / statistics.median(seconds["jax"]), rel=1e-12)


def test_torch_twin_bf16_autocast_tracks_fp32():
    """The bf16 peer (autocast) computes the same model: its first loss is within bf16 rounding of fp32's."""
    from jaxformer.benchmarks.torch_reference import make_torch_step

    cfg = dataclasses.replace(get_preset("tiny"), num_layers=1)
    windows = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (4, 33)))
    losses = {bf16: float(make_torch_step(cfg, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8, grad_clip=1.0,
                                          bf16=bf16)(windows).detach()) for bf16 in (False, True)}
    assert losses[True] != losses[False] and losses[True] == pytest.approx(losses[False], rel=0.01)


def test_op_classes_reads_compiled_hlo():
    """dots (bare or fused) are matmuls, all-reduce a collective, the rest by opcode, from XLA's own text."""
    from jaxformer.benchmarks.profile import op_classes

    hlo = jax.jit(lambda a, b: jax.numpy.tanh(a @ b) + 1.0).lower(np.ones((64, 64), np.float32),
                                                              np.ones((64, 64), np.float32)).compile().as_text()
    classes = op_classes(hlo)
    dots = [re.search(r"%([\w.\-]+) = ", line).group(1) for line in hlo.splitlines() if " dot(" in line]
    assert dots and all(classes[name] == "matmul" for name in dots)
    assert set(classes.values()) <= {"matmul", "collective", "copy", "other"}
    text = ("HloModule m\n\n%fused (p: f32[2]) -> f32[2] {\n  %p = f32[2]{0} parameter(0)\n"
            "  ROOT %d = f32[2]{0} dot(%p, %p), lhs_contracting_dims={}\n}\n\nENTRY %main {\n"
            "  %x = f32[2]{0} parameter(0)\n  %f.1 = f32[2]{0} fusion(%x), kind=kOutput, calls=%fused\n"
            "  %ar = (f32[2]{0}, /*index=1*/f32[2]{0}) all-reduce(%f.1, %x), to_apply=%add\n"
            "  ROOT %t = f32[2]{0} transpose(%x), dimensions={0}\n}\n")
    assert {k: op_classes(text)[k] for k in ("f.1", "ar", "t", "x")} == {
        "f.1": "matmul", "ar": "collective", "t": "copy", "x": "other"}


def test_bench_profile_sums_the_traced_step(tmp_path, capsys):
    assert main(["bench", "profile", "--size", "16:1:32", "--batch", "4", "--steps", "2", "--top", "3",
                 "--json", str(tmp_path / "p.json")]) == 0
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["cpu_model"] == cpu_model() and report["by_class"]["matmul"] > 0
    assert sum(report["by_class"].values()) == pytest.approx(report["op_s_per_step"])
    assert sum(row["s_per_step"] for row in report["instructions"]) == pytest.approx(report["op_s_per_step"])
    assert "matmul" in capsys.readouterr().out


def test_bench_profile_traces_the_named_attention_implementation(tmp_path, capsys):
    from jaxformer.functional import fused_attention

    assert main(["bench", "profile", "--size", "16:1:32", "--batch", "4", "--steps", "1", "--top", "40",
                 "--attention-impl", "fused", "--json", str(tmp_path / "p.json")]) == 0
    report = json.loads((tmp_path / "p.json").read_text())
    names = [row["name"] for row in report["instructions"]]
    assert report["attention_impl"] == "fused"
    assert any(name.startswith("ffi_call") or "custom-call" in name for name in names) == fused_attention.fused_available()
    assert main(["bench", "profile", "--attention-impl", "flash"]) == 2
    assert "attention_impl must be one of" in capsys.readouterr().err


def test_bench_train_times_the_fused_kernel_and_says_when_it_is_missing(tmp_path):
    from jaxformer.functional import fused_attention

    assert main(["bench", "train", "--sizes", "16:1:32", "--batch", "4", "--steps", "1", "--repeats", "1", "--no-torch",
                 "--dtypes", "float32", "--attention-impl", "fused", "--json", str(tmp_path / "f.json")]) == 0
    report = json.loads((tmp_path / "f.json").read_text())
    assert report["attention_impl"] == "fused" and report["sizes"][0]["jax_tokens_per_s"] > 0
    assert any("fused kernel unavailable" in note for note in report["notes"]) == (not fused_attention.fused_available())


_ONE_DEVICE = """
import json, sys
import jax, numpy as np
from jaxformer.benchmarks.train import bench_config
from jaxformer.cli import main
from jaxformer.train.throughput import TrainStepRunner

config = bench_config(16, 1, 32, 4)
mesh, alone = TrainStepRunner(config), TrainStepRunner(config, one_device=True)
assert (mesh.devices, alone.devices) == (2, 1)
difference = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                          mesh.state["params"], alone.state["params"])
print("max difference", max(jax.tree.leaves(difference)))
sys.exit(main(["bench", "train", "--sizes", "16:1:32", "--batch", "4", "--steps", "1", "--repeats", "1", "--no-torch",
               "--dtypes", "float32", "--one-device", "--json", sys.argv[1]]))
"""


def test_one_device_trains_the_same_step_as_the_mesh_and_the_bench_compares_them(tmp_path):
    """The per-size device layout: the first device alone (every core's threads) against one device per core.

    Its four programs compile without LLVM's optimisations (about half their compile time): what is tested is the
    two layouts' equal step and the bench's report of them, not their speed."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0",
           "JAX_PLATFORMS": "cpu", "JAXFORMER_TUNE": "0"}
    done = subprocess.run([sys.executable, "-c", _ONE_DEVICE, str(tmp_path / "o.json")], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split("max difference ")[1].split()[0]) < 1e-5  # one step from one initial state
    row = json.loads((tmp_path / "o.json").read_text())["sizes"][0]
    assert row["devices"] == 2 and row["one_device_tokens_per_s"] > 0
    assert row["one_device_ratio"] == pytest.approx(row["one_device_tokens_per_s"] / row["jax_tokens_per_s"])
    assert "one device" in done.stdout and "the 2-device mesh" in done.stdout
