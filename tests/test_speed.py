"""The CPU speed work changes no numbers, compiles once per shape, and runs in the tuned process environment."""

import dataclasses
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.runtime import HUGE_PAGES, NO_YNN_FUSION, tuned_environment
from jaxformer.train.config import load_config
from jaxformer.train.optimizer import make_optimizer
from jaxformer.train.step import build_state, make_train_step
from jaxformer.train.throughput import random_windows


def _losses(config, steps: int) -> list[float]:
    """Per-step train losses of ``steps`` AdamW updates, all on the same random windows (memorised)."""
    optimizer = make_optimizer(config.optimizer)
    graphdef, state = build_state(config.model, 0, optimizer)
    step = make_train_step(graphdef, optimizer, "float32")
    windows = jnp.asarray(random_windows(config))
    losses, total = [], 0.0
    for _ in range(steps):
        state = step(state, windows, np.float32(config.optimizer.lr))
        new_total = float(state["sums"]["loss"])
        losses.append(new_total - total)
        total = new_total
    return losses


def test_fast_attention_path_leaves_a_few_steps_losses_unchanged():
    """Causal query blocks (the default) against the plain single-block pass, 4 AdamW steps."""
    config = load_config(None, ["model.d_model=32", "model.num_layers=2", "model.num_heads=2", "model.max_seq_len=64",
                                "train.seq_len=64", "train.batch_size=4", "optimizer.lr=1e-2"])
    assert config.model.attention_query_blocks > 1
    plain = dataclasses.replace(config, model=dataclasses.replace(config.model, attention_query_blocks=1))
    fast_losses, plain_losses = _losses(config, 4), _losses(plain, 4)
    assert plain_losses[-1] < plain_losses[0] - 0.05  # the steps do train
    np.testing.assert_allclose(fast_losses, plain_losses, rtol=2e-6)


def _train(tmp_path, name: str, cache: str) -> subprocess.CompletedProcess:
    (tmp_path / "empty.yaml").write_text("{}\n")
    command = [sys.executable, "-m", "jaxformer.cli", "train", str(tmp_path / "empty.yaml"), "model.d_model=16", "model.num_layers=1",
               "model.num_heads=2", "model.max_seq_len=16", "train.seq_len=16", "train.batch_size=2",
               "train.tokens=128", "train.eval_tokens=32", "train.peak_flops=1e12", "data.corpus=synthetic-markov",
               "data.markov.bytes=20000", f"train.compilation_cache={cache}", "logging.progress=plain",
               "logging.tensorboard=false", "--run-dir", str(tmp_path / name)]
    env = {**os.environ, "JAX_LOG_COMPILES": "1", "JAX_PLATFORMS": "cpu"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=True)


@pytest.mark.slow
def test_second_identical_run_hits_the_compilation_cache(tmp_path):
    cache = str(tmp_path / "xla")
    first, second = _train(tmp_path, "first", cache), _train(tmp_path, "second", cache)
    hit = "Persistent compilation cache hit for 'jit_train_step'"
    assert hit not in first.stderr and hit in second.stderr
    assert "cache hit for 'jit_eval_pass'" in second.stderr
    first_s, second_s = (json.loads((tmp_path / n / "final.json").read_text())["compile_s"] for n in ("first", "second"))
    assert second_s < first_s


def test_tuned_environment_adds_its_settings_once_and_keeps_the_users():
    assert tuned_environment({}) == {"GLIBC_TUNABLES": HUGE_PAGES, "XLA_FLAGS": NO_YNN_FUSION}
    tuned = tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "XLA_FLAGS": "--xla_foo=1"})
    assert tuned["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{HUGE_PAGES}"
    assert tuned["XLA_FLAGS"] == f"--xla_foo=1 {NO_YNN_FUSION}"
    assert tuned_environment(tuned) == tuned
    mine = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0", "XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=dot"}
    assert tuned_environment(mine) == mine
    assert tuned_environment({"JAXFORMER_TUNE": "0"}) == {"JAXFORMER_TUNE": "0"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tunable is glibc's")
def test_the_command_line_runs_in_the_tuned_environment(tmp_path):
    """`jaxformer bench train` records the environment it ran in; the CLI re-executed itself into it."""
    env = {key: value for key, value in os.environ.items() if key not in ("GLIBC_TUNABLES", "XLA_FLAGS")}
    out = tmp_path / "b.json"
    subprocess.run([sys.executable, "-m", "jaxformer.cli", "bench", "train", "--sizes", "16:1:16", "--batch", "2",
                    "--steps", "1", "--repeats", "1", "--no-torch", "--json", str(out)],
                   env=env, check=True, capture_output=True, timeout=300)
    environment = json.loads(out.read_text())["environment"]
    assert HUGE_PAGES in environment["GLIBC_TUNABLES"] and NO_YNN_FUSION in environment["XLA_FLAGS"]
