"""``kernel.attention_impl: auto``: the run times its candidates, trains with the fastest, and caches the answer."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import jaxformer.functional as F
from jaxformer.functional import fused_attention
from jaxformer.train import kernel_choice
from jaxformer.train.config import load_config
from jaxformer.train.loop import train

TINY = ["model.d_model=32", "model.num_layers=1", "model.num_heads=4", "model.max_seq_len=64",
        "data.corpus=synthetic-markov", "data.markov.order=1", "data.markov.alphabet=32",
        "data.markov.bytes=200000", "optimizer.lr=1e-2", "train.batch_size=8", "train.seq_len=64",
        "train.tokens=20480", "train.eval_tokens=4096", "logging.progress=plain", "logging.tensorboard=false"]
compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None and
                              not os.environ.get(fused_attention.LIBRARY_ENV),
                              reason="no C++ compiler to build the fused kernel")
# the fused kernel is the CPU's candidate; other backends time XLA's attention (cuDNN's on a GPU) instead
ON_CPU = jax.default_backend() == "cpu"
CANDIDATES = {"naive", "fused" if ON_CPU else "xla"}
cpu_only = pytest.mark.skipif(not ON_CPU, reason="the fused kernel's scope and loader are the CPU's")


def test_fastest_needs_a_margin_over_the_reference():
    assert kernel_choice.fastest({"naive": 1.0, "fused": 0.5}) == "fused"
    assert kernel_choice.fastest({"naive": 1.0, "fused": 0.98}) == "naive"  # within the 3% margin
    assert kernel_choice.fastest({"naive": 0.7, "fused": 1.0}) == "naive"
    assert kernel_choice.fastest({"naive": 1.0, "xla": 0.9}) == "xla"


@cpu_only
def test_out_of_scope_models_have_one_candidate_and_say_why():
    cases = {"model.position=alibi": "attention bias", "model.sliding_window=16": "no sliding window"}
    for override, why in cases.items():
        impls, reason = kernel_choice.candidates(load_config(None, TINY + [override]))
        assert impls == ["naive"] and why in reason
    bf16 = kernel_choice.candidates(load_config(None, TINY + ["train.compute_dtype=bfloat16"]))
    assert bf16 == (["naive", "fused"], "")  # the kernel computes bf16 inputs in fp32


def test_a_named_implementation_is_kept():
    config = load_config(None, TINY + ["kernel.attention_impl=naive"])
    assert kernel_choice.choose(config) == (config, kernel_choice.KernelChoice("naive", "set"))


def test_auto_is_resolved_by_training_not_by_the_layers():
    with pytest.raises(ValueError, match="'auto' is chosen per run by training"):
        F.attention(np.zeros((1, 4, 2, 8), np.float32), np.zeros((1, 4, 2, 8), np.float32),
                    np.zeros((1, 4, 2, 8), np.float32), impl="auto")


@compiler
def test_auto_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    path = tmp_path / "kernel.json"
    config = load_config(None, TINY + ["kernel.attention_impl=auto"])
    chosen, choice = kernel_choice.choose(config, path)
    assert choice.source == "measured" and set(choice.call_s) == CANDIDATES
    assert all(seconds > 0 for seconds in choice.call_s.values()) and choice.seconds > 0
    assert choice.attention_impl == kernel_choice.fastest(choice.call_s)
    assert chosen.kernel.attention_impl == choice.attention_impl
    saved = json.loads(path.read_text())
    assert list(saved) == [kernel_choice.call_key(config)]
    assert saved[kernel_choice.call_key(config)]["call_s"] == choice.call_s

    def no_measuring(*args, **kwargs):
        raise AssertionError("a cached attention call was measured again")

    monkeypatch.setattr(kernel_choice, "measure", no_measuring)
    again, cached = kernel_choice.choose(load_config(None, TINY + ["kernel.attention_impl=auto", "train.seed=3",
                                                                  "optimizer.lr=3e-3", "train.tokens=40960"]), path)
    assert cached.source == "cache" and cached.attention_impl == choice.attention_impl
    assert cached.call_s == choice.call_s and cached.seconds < 1.0
    # a model that differs outside attention (depth, MLP width) makes the same call: the answer is shared
    deeper = load_config(None, TINY + ["kernel.attention_impl=auto", "model.num_layers=3", "model.d_ff=96"])
    assert kernel_choice.choose(deeper, path)[1].source == "cache"
    # other heads, another sequence length or another batch are another call: measured afresh
    for change in ("model.d_model=48", "train.seq_len=32", "train.batch_size=4"):
        other = load_config(None, TINY + ["kernel.attention_impl=auto", change])
        assert kernel_choice.call_key(other) != kernel_choice.call_key(config), change
        with pytest.raises(AssertionError, match="measured again"):
            kernel_choice.choose(other, path)


@compiler
def test_a_run_with_auto_trains_as_the_chosen_implementation_does(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_choice, "KERNEL_FILE", tmp_path / "kernel.json")
    auto = train(load_config(None, TINY + ["kernel.attention_impl=auto"]), tmp_path / "auto")
    choice = auto["kernel_choice"]
    assert choice["source"] == "measured" and choice["attention_impl"] in CANDIDATES
    assert auto["config"]["kernel"]["attention_impl"] == choice["attention_impl"]
    assert auto["time"]["kernel_choice_s"] == choice["seconds"] > 0
    assert "attention_impl: auto" in (tmp_path / "auto" / "config.yaml").read_text()  # as the user asked
    named = train(load_config(None, TINY + [f"kernel.attention_impl={choice['attention_impl']}"]), tmp_path / "named")
    assert named["kernel_choice"]["source"] == "set"
    np.testing.assert_allclose(auto["val_loss"], named["val_loss"], rtol=1e-6)
    np.testing.assert_allclose(auto["train_loss"], named["train_loss"], rtol=1e-6)


@cpu_only
def test_without_the_kernel_auto_is_naive_and_measures_nothing(tmp_path):
    """The loader pointed at a library that does not exist: one candidate, nothing timed, nothing cached."""
    script = f"""
        from jaxformer.train import kernel_choice
        from jaxformer.train.config import load_config
        config = load_config(None, {TINY + ['kernel.attention_impl=auto']!r})
        chosen, choice = kernel_choice.choose(config, {str(tmp_path / 'kernel.json')!r})
        assert chosen.kernel.attention_impl == "naive", choice
        assert choice.source == "only" and choice.call_s == {{}}, choice
        assert "unavailable" in choice.reason and "absent" in choice.reason, choice
        print("naive without the kernel")
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, fused_attention.LIBRARY_ENV: str(tmp_path / "absent" / "lib.so")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "naive without the kernel" in done.stdout
    assert not (tmp_path / "kernel.json").exists()


@compiler
def test_bench_train_auto_reports_each_sizes_choice_and_fills_the_cache(tmp_path, monkeypatch, capsys):
    from jaxformer.cli import main

    monkeypatch.setattr(kernel_choice, "KERNEL_FILE", tmp_path / "kernel.json")
    assert main(["bench", "train", "--sizes", "16:1:32", "--batch", "4", "--steps", "1", "--repeats", "1",
                 "--no-torch", "--dtypes", "float32", "--attention-impl", "auto", "--json", str(tmp_path / "b.json")]) == 0
    row = json.loads((tmp_path / "b.json").read_text())["sizes"][0]
    assert row["kernel_choice"]["source"] == "measured"
    assert row["attention_impl"] == kernel_choice.fastest(row["kernel_choice"]["call_s"])
    assert len(json.loads((tmp_path / "kernel.json").read_text())) == 1
    assert f" {row['attention_impl']:>6}" in capsys.readouterr().out


@compiler
def test_two_workers_meeting_one_attention_call_time_it_once(tmp_path):
    """Two processes choose for the same attention call at once: one times it, the other waits and reads its answer."""
    script = f"""
        import json, sys
        from jaxformer.train import kernel_choice
        from jaxformer.train.config import load_config
        config = load_config(None, {TINY + ['kernel.attention_impl=auto']!r})
        print(json.dumps(kernel_choice.choose(config, {str(tmp_path / 'kernel.json')!r})[1].to_record()))
    """
    workers = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [worker.communicate(timeout=300) for worker in workers]
    assert all(worker.returncode == 0 for worker in workers), outputs
    choices = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert sorted(choice["source"] for choice in choices) == ["cache", "measured"]
    assert choices[0]["attention_impl"] == choices[1]["attention_impl"]
    assert choices[0]["call_s"] == choices[1]["call_s"]


@compiler
def test_the_timed_call_is_the_runs_attention_forward_and_backward():
    """The program `measure` times computes the gradients of the run's own attention, for every candidate."""
    import jax

    config = load_config(None, TINY + ["model.num_kv_heads=2"])
    programs, (q, k, v, cotangent) = kernel_choice.attention_programs(config, ["naive", "fused"])
    assert q.shape == (8, 64, 4, 8) and k.shape == (8, 64, 2, 8)
    expected = jax.vjp(lambda q, k, v: F.dot_product_attention(
        q, k, v, mask=F.causal_mask(64)), q, k, v)[1](cotangent)
    for impl, program in programs.items():
        for got, want in zip(program(q, k, v, cotangent), expected):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5, err_msg=impl)


@pytest.mark.parametrize("content", [
    b"\xff\xfe\x00garbage", b"[]", b"null", b'{"KEY": {"attention_impl": "fu',
    json.dumps({"KEY": "fused"}).encode(),
    json.dumps({"KEY": {"call_s": {"naive": 1, "fused": 2}}}).encode(),
    json.dumps({"KEY": {"attention_impl": "xla", "call_s": {"naive": 1, "fused": 2}}}).encode(),
    json.dumps({"KEY": {"attention_impl": "fused", "call_s": [1, 2]}}).encode(),
    json.dumps({"KEY": {"attention_impl": "fused", "call_s": {"naive": "1", "fused": 2}}}).encode(),
], ids=["binary", "list", "null", "truncated", "entry-not-object", "no-choice", "choice-not-a-candidate",
        "timings-not-object", "timing-not-a-number"])
def test_a_corrupt_cache_is_measured_again_and_rewritten(tmp_path, content):
    path = tmp_path / "kernel.json"
    path.write_bytes(content)
    timed = {"naive": 1.0, "fused": 0.5}
    impl, source, call_s, _ = kernel_choice.decide(path, "KEY", ["naive", "fused"], lambda: timed,
                                                   kernel_choice.fastest, "attention_impl")
    assert (impl, source, call_s) == ("fused", "measured", timed)
    saved = json.loads(path.read_text())
    assert list(saved) == ["KEY"] and saved["KEY"]["attention_impl"] == "fused" and saved["KEY"]["call_s"] == timed
    assert kernel_choice.decide(path, "KEY", ["naive", "fused"], None, None, "attention_impl")[:3] == (
        "fused", "cache", timed)  # the rewritten entry is read back: nothing is timed


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"[]", json.dumps({"KEY": "fast"}).encode()])
def test_a_corrupt_peak_cache_is_probed_again(tmp_path, monkeypatch, content):
    from jaxformer.train import peak

    path = tmp_path / "peak.json"
    path.write_bytes(content)
    monkeypatch.setattr(peak, "machine_key", lambda dtype: "KEY")
    monkeypatch.setattr(peak, "probe_matmul_peak", lambda dtype, impl: 5e9)
    assert peak.machine_peak_flops("float32", path) == 5e9
    assert json.loads(path.read_text()) == {"KEY": 5e9}
