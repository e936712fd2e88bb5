"""Softmax cross-entropy with integer labels: optax's ``softmax_cross_entropy_with_integer_labels`` (through
`jax.nn.logsumexp`), operation for operation, except how the row maximum is found.

XLA:CPU rewrites a reduction over more than 32 elements into a reduce-window, and its maximum over the logits of a
step (tokens × a 256-byte vocabulary) ran several times slower than the same maximum taken as a tree of elementwise
maxima down to 32 lanes (docs/cpu-speed.md, session 26), which is what `row_max` does on a CPU. A maximum is exact
in any order, so every loss and gradient is bitwise optax's (tests/test_cross_entropy.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

LANES = 32  # the widest reduction XLA:CPU keeps as one reduce


def row_max(x_NV: jax.Array) -> jax.Array:
    """``[N]``: the maximum over the last axis. On a CPU it is halved by elementwise maxima while its width is even
    and above `LANES`, then reduced (a NaN propagates as through ``jnp.max``); other backends reduce it at once, as
    their reductions are fast and a vocabulary-parallel (``tensor``-sharded) axis is better reduced in place than
    halved across its shards."""
    halve = jax.default_backend() == "cpu"
    while halve and x_NV.shape[-1] > LANES and x_NV.shape[-1] % 2 == 0:
        half = x_NV.shape[-1] // 2
        x_NV = jnp.maximum(x_NV[..., :half], x_NV[..., half:])
    return jnp.max(x_NV, axis=-1)


def cross_entropy(logits_NV: jax.Array, labels_N: jax.Array) -> jax.Array:
    """``[N]``: ``logsumexp(logits) - logits[label]`` in nats, as optax computes it (leading axes are kept)."""
    amax_N = row_max(logits_NV)
    amax_N = lax.stop_gradient(lax.select(jnp.isfinite(amax_N), amax_N, lax.full_like(amax_N, 0)))
    sumexp_N = lax.exp(lax.sub(logits_NV, amax_N[..., None])).sum(axis=-1)
    log_normalizer_N = lax.add(lax.log(abs(sumexp_N)), amax_N)
    return log_normalizer_N - jnp.take_along_axis(logits_NV, labels_N[..., None], axis=-1)[..., 0]
