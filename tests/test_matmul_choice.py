"""``kernel.matmul_impl: auto``: a run (bf16 or fp32) times XLA's and oneDNN's matmul on its projection, trains with the
faster, and caches the answer."""

import json

import numpy as np
import pytest

import jaxformer.functional as F
from jaxformer.functional import onednn_matmul
from jaxformer.train import kernel_choice, matmul_choice
from jaxformer.train.config import load_config
from jaxformer.train.loop import train

TINY = ["model.d_model=32", "model.num_layers=1", "model.num_heads=4", "model.max_seq_len=64",
        "data.corpus=synthetic-markov", "data.markov.order=1", "data.markov.alphabet=32",
        "data.markov.bytes=200000", "optimizer.lr=1e-2", "train.batch_size=8", "train.seq_len=64",
        "train.tokens=20480", "train.eval_tokens=4096", "logging.progress=plain", "logging.tensorboard=false",
        "train.compute_dtype=bfloat16"]


def timed(*overrides: str) -> list[str]:
    """TINY with ``auto`` and a compute dtype both candidates take: bf16, fp32 where oneDNN has no bf16 matmul."""
    dtype = "float32" if onednn_matmul.unsupported_reason("bfloat16") else "bfloat16"
    return TINY + ["kernel.matmul_impl=auto", f"train.compute_dtype={dtype}", *overrides]


def test_candidates_and_the_reference_margin():
    bf16_reason = onednn_matmul.unsupported_reason("bfloat16")  # an AVX2-only CPU has no oneDNN bf16 matmul
    assert matmul_choice.candidates(load_config(None, TINY)) == ((["xla"], bf16_reason) if bf16_reason
                                                                 else (["xla", "onednn"], ""))
    assert matmul_choice.candidates(load_config(None, TINY + ["train.compute_dtype=float32"])) == (["xla", "onednn"], "")
    assert matmul_choice.fastest({"xla": 1.0, "onednn": 0.5}) == "onednn"
    assert matmul_choice.fastest({"xla": 1.0, "onednn": 0.98}) == "xla"  # within the margin: the reference
    with pytest.raises(ValueError, match="'auto' is chosen per run by training"):
        F.dense(np.zeros((2, 4), np.float32), np.zeros((4, 3), np.float32), impl="auto")


def test_auto_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    path = tmp_path / "kernel.json"
    config = load_config(None, timed())
    chosen, choice = matmul_choice.choose(config, path)
    assert choice.source == "measured" and list(choice.call_s) == matmul_choice.candidates(config)[0]
    assert all(seconds > 0 for seconds in choice.call_s.values())
    assert choice.matmul_impl == matmul_choice.fastest(choice.call_s) == chosen.kernel.matmul_impl
    assert json.loads(path.read_text())[matmul_choice.call_key(config)]["matmul_impl"] == choice.matmul_impl

    def no_measuring(*args, **kwargs):
        raise AssertionError("a cached projection was measured again")

    monkeypatch.setattr(matmul_choice, "measure", no_measuring)
    cached = matmul_choice.choose(load_config(None, timed("train.seed=3")), path)[1]
    assert cached.source == "cache" and cached.matmul_impl == choice.matmul_impl
    with pytest.raises(AssertionError, match="measured again"):  # another width is another projection
        matmul_choice.choose(load_config(None, timed("model.d_ff=128")), path)


def test_a_run_with_auto_records_the_choice_and_trains_as_it_does(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_choice, "KERNEL_FILE", tmp_path / "kernel.json")
    auto = train(load_config(None, timed()), tmp_path / "auto")
    choice = auto["matmul_choice"]
    assert choice["source"] == "measured" and auto["config"]["kernel"]["matmul_impl"] == choice["matmul_impl"]
    assert auto["time"]["kernel_choice_s"] == pytest.approx(choice["seconds"]) and choice["seconds"] > 0
    assert "matmul_impl: auto" in (tmp_path / "auto" / "config.yaml").read_text()  # as the user asked
    named = train(load_config(None, timed(f"kernel.matmul_impl={choice['matmul_impl']}")), tmp_path / "named")
    assert named["matmul_choice"]["source"] == "set"
    np.testing.assert_allclose(auto["val_loss"], named["val_loss"], rtol=1e-6)
