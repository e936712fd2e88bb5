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
