"""`jaxformer bench train`'s PyTorch twin computes the same model as jaxformer, and the bench runs."""

import dataclasses
import json

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer.benchmarks.torch_reference import TorchDecoder, load_jax_params
from jaxformer.cli import main
from jaxformer.models import get_preset
from jaxformer.models.pure import apply, init_params


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
    row = report["sizes"][0]
    assert row["params"] > 0 and row["ratio"] == pytest.approx(row["jax_tokens_per_s"] / row["torch_tokens_per_s"])
    assert 0 < row["jax_mfu"] < 1 and report["matmul_peak_flops"] > 1e8
    assert "ratio" in capsys.readouterr().out
