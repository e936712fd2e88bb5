"""Turning next-token logits into a distribution and drawing from it."""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp


def _greedy(temperature: float) -> bool:
    """Temperature 0, or one too small for float32's normal range (the limit, argmax; XLA flushes denormals to 0)."""
    return temperature < jnp.finfo(jnp.float32).tiny


def _check(temperature: float, top_k: int | None, top_p: float | None, vocab: int) -> None:
    if not temperature >= 0:  # NaN included
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)
                              or not 1 <= top_k <= vocab):
        raise ValueError(f"top_k must be an integer in [1, {vocab}], got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def sampling_distribution(
    logits: jax.Array, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> jax.Array:
    """Probabilities ``[..., V]`` that :func:`sample_logits` draws from.

    ``softmax(logits / T)`` restricted to the ``top_k`` most likely tokens (all tokens tied with the k-th
    kept, as transformers' ``TopKLogitsWarper``) and to the smallest set whose mass reaches ``top_p``
    (nucleus; among tied tokens the lower ids first; ``top_p = 1`` keeps every token), then renormalised.
    Temperature 0 is greedy: all mass on the argmax (also below float32's smallest normal number, the limit).
    """
    vocab = logits.shape[-1]
    _check(temperature, top_k, top_p, vocab)
    logits = logits.astype(jnp.float32)
    if _greedy(temperature):
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), vocab)
    # shifted to a maximum of 0 first: divided by a tiny temperature, the others go to -inf, not all to +inf (NaN)
    logits = (logits - jnp.max(logits, axis=-1, keepdims=True)) / temperature
    if top_k is not None:
        kth_largest = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
    if top_p is not None and top_p < 1.0:
        order = jnp.argsort(logits, axis=-1, descending=True, stable=True)
        sorted_probs = jax.nn.softmax(jnp.take_along_axis(logits, order, axis=-1), axis=-1)
        cumulative = jnp.cumsum(sorted_probs, axis=-1)
        # a token is in the nucleus while the mass ranked before it is short of top_p (of the rounded total)
        inside_sorted = cumulative - sorted_probs < top_p * cumulative[..., -1:]
        inside = jnp.put_along_axis(jnp.zeros_like(inside_sorted), order, inside_sorted, axis=-1, inplace=False)
        logits = jnp.where(inside, logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)


def sample_logits(
    key: jax.Array, logits: jax.Array, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> jax.Array:
    """Draws token ids ``[...]`` from ``logits [..., V]``; temperature 0 is greedy (argmax), as are temperatures
    below float32's smallest normal number."""
    _check(temperature, top_k, top_p, logits.shape[-1])
    if _greedy(temperature):
        return jnp.argmax(logits, axis=-1)
    probs = sampling_distribution(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return jax.random.categorical(key, jnp.log(probs), axis=-1)
