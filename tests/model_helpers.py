"""Tiny configurations shared by the model tests (same shapes, so compiled kernels are reused)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxformer.architecture import ModelConfig

TINY = dict(vocab_size=32, d_model=16, num_heads=2, num_layers=1, max_seq_len=16, use_bias=False)


def tiny(**overrides) -> ModelConfig:
    """A one-layer, width-16 model; ``overrides`` pick the family, positions, norms…"""
    data = {**TINY, **overrides}
    if data.get("family") == "encoder_decoder":
        data.setdefault("num_encoder_layers", 1)
    return ModelConfig(**data)


def tokens(batch: int, length: int, seed: int = 0, vocab: int = TINY["vocab_size"]) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab, dtype=jnp.int32)


def jit_forward(model):
    """``model``'s forward as one jitted program (a single compile instead of one per eager op)."""
    import functools

    from flax import nnx

    from jaxformer.models import apply

    graphdef, state = nnx.split(model)
    forward = jax.jit(functools.partial(apply, graphdef))
    return lambda *inputs, **kwargs: forward(state, *inputs, **kwargs)


def train_losses(overrides: list[str], steps: int = 4, target: str | None = None):
    """The per-step losses of a small decoder trained ``steps`` Adam steps on fixed random bytes
    (``train.compute_dtype`` and ``kernel.*`` from ``overrides``), its final state, and whether the FFI
    ``target`` appears in the step's program."""
    import numpy as np
    import optax

    from jaxformer.train.config import load_config
    from jaxformer.train.step import build_state, make_train_step

    windows = jnp.asarray(np.random.default_rng(0).integers(0, 256, (1, 4, 33)).astype(np.int32))
    lr = np.float32(1e-2)
    config = load_config(None, ["model.d_model=64", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
                                "model.max_seq_len=32", "train.seq_len=32", *overrides])
    optimizer = optax.adam(1e-2)
    graphdef, state = build_state(config.model, 0, optimizer, config.kernel)
    step = make_train_step(graphdef, optimizer, config.train.compute_dtype)
    calls = target is not None and target in str(jax.make_jaxpr(step)(state, windows, lr))
    running = [0.0]
    for _ in range(steps):
        state = step(state, windows, lr)
        running.append(float(state["sums"]["loss"]))  # the running sum since the last log row
    return np.diff(running), state, calls


def run_python(script: str, env: dict):
    """Runs ``script`` (dedented) in a fresh Python with ``env`` added to this environment; asserts it exits 0."""
    import os
    import subprocess
    import sys
    import textwrap

    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    return done
