"""Turning next-token logits into a distribution and drawing from it."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _check(temperature: float, top_k: int | None, top_p: float | None, vocab: int) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and not 1 <= top_k <= vocab:
        raise ValueError(f"top_k must be in [1, {vocab}], got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def sampling_distribution(
    logits: jax.Array, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> jax.Array:
    """Probabilities ``[..., V]`` that :func:`sample_logits` draws from.

    ``softmax(logits / T)`` restricted to the ``top_k`` most likely tokens and to the
    smallest set whose mass reaches ``top_p`` (nucleus), then renormalised.
    Temperature 0 is greedy: all mass on the argmax.
    """
    vocab = logits.shape[-1]
    _check(temperature, top_k, top_p, vocab)
    logits = logits.astype(jnp.float32)
    if temperature == 0:
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), vocab)
    logits = logits / temperature
    if top_k is not None:
        kth_largest = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
    if top_p is not None:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        # the smallest logit still inside the nucleus: tokens ranked before the mass reached top_p
        cutoff = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.nn.softmax(logits, axis=-1)


def sample_logits(
    key: jax.Array, logits: jax.Array, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> jax.Array:
    """Draws token ids ``[...]`` from ``logits [..., V]``; temperature 0 is greedy (argmax)."""
    if temperature == 0:
        _check(temperature, top_k, top_p, logits.shape[-1])
        return jnp.argmax(logits, axis=-1)
    probs = sampling_distribution(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return jax.random.categorical(key, jnp.log(probs), axis=-1)
