"""Autoregressive generation with a KV cache: one prefill, then one jitted step per token.

``decode_step`` runs the model on new tokens against the cache and samples the next
token; it is jitted once for the prompt's length and once for single tokens, and the cache
has a fixed size (prompt + new tokens), so decoding never recompiles. Decoder LMs
continue the prompt; an encoder–decoder encodes the prompt once and decodes a target
that starts from ``start_token``.
"""

from __future__ import annotations

import functools
import numbers
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxformer.functional as F
from jaxformer.architecture import ModelConfig, check_context
from jaxformer.models.kv_cache import KVCache


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, vocab_size: int) -> None:
    """One-line ``ValueError`` for sampling options that cannot be used (before anything compiles)."""
    F.sampling_distribution(jnp.zeros((vocab_size,)), temperature=temperature, top_k=top_k, top_p=top_p)


def _prompt_batch(prompt, cfg: ModelConfig) -> jax.Array:
    """``[B, T]`` int32 token ids from ``[T]`` or ``[B, T]`` ids; checks the vocabulary."""
    try:
        tokens = np.asarray(prompt)
    except ValueError:  # rows of different lengths
        raise ValueError("prompt must be a [T] or [B, T] array of token ids: its rows have different lengths "
                         "(pad them, or generate for each)") from None
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2 or tokens.shape[1] == 0 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"prompt must be a non-empty [T] or [B, T] array of token ids, got shape {tokens.shape}")
    if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {cfg.vocab_size}), got {tokens.min()}..{tokens.max()}")
    return jnp.asarray(tokens, jnp.int32)


@functools.lru_cache(maxsize=32)
def decode_step(graphdef: nnx.GraphDef, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None):
    """The jitted ``advance(state, tokens_BT, cache, key, step, context_kvs=None) -> (next_B1, cache)`` of a model.

    ``advance`` appends ``tokens_BT`` to ``cache`` (donated) and samples the next token
    ``[B, 1]`` from the last position's logits (shaped to be fed straight back) with
    ``fold_in(key, step)``; ``context_kvs`` are an encoder–decoder's cross-attention
    keys and values of the encoded source (None for a decoder LM). Built once per (model structure, sampling
    options) — hashing the graph on every token would cost more than a small model's step.
    """

    @functools.partial(jax.jit, donate_argnames=("cache",))
    def advance(state, tokens_BT, cache: KVCache, key, step, context_kvs=None) -> tuple[jax.Array, KVCache]:
        model = nnx.merge(graphdef, state)
        if context_kvs is None:
            logits_BTV, cache = model.extend(tokens_BT, cache)
        else:
            logits_BTV, cache = model.extend(tokens_BT, context_kvs, cache)
        next_B = F.sample_logits(jax.random.fold_in(key, step), logits_BTV[:, -1], temperature=temperature,
                                 top_k=top_k, top_p=top_p)
        return next_B[:, None].astype(jnp.int32), cache

    return advance


@functools.lru_cache(maxsize=32)
def _encoder(graphdef: nnx.GraphDef):
    """The jitted ``encode(state, source_BS) -> context_kvs`` of an encoder–decoder (once per decode)."""
    return jax.jit(lambda state, source_BS: nnx.merge(graphdef, state).context_kvs(source_BS))


def generate(
    model: nnx.Module,
    prompt: Sequence[int] | np.ndarray | jax.Array,
    *,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    start_token: int = 0,
    cache_dtype=jnp.float32,
    stop_tokens: Sequence[int] = (),
) -> jax.Array:
    """Samples up to ``max_new_tokens`` tokens after ``prompt`` and returns them.

    Returns ``[n]`` token ids (``[B, n]`` for a batched prompt), n = ``max_new_tokens`` unless every row has
    sampled one of ``stop_tokens`` (a checkpoint's end-of-sequence ids) before: then n ends at the step where the
    last row did, and a row that stopped earlier holds its stop token from there on (as transformers pads after EOS).

    model: a decoder LM (continues the prompt) or an encoder–decoder (the prompt is the
      source; the target starts with ``start_token``).
    prompt: token ids ``[T]`` or ``[B, T]`` (all rows the same length).
    temperature: 0 is greedy (argmax); top_k / top_p restrict to the k most likely tokens
      / the nucleus of mass ``top_p`` (see ``jaxformer.functional.sampling_distribution``).
    seed: the sampling key; the same seed gives the same tokens.
    """
    cfg: ModelConfig = model.cfg
    if cfg.family == "encoder":
        raise ValueError("generation needs a decoder or encoder_decoder model, got model.family 'encoder'")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    max_new_tokens = int(max_new_tokens)
    if cfg.family == "encoder_decoder" and not 0 <= start_token < cfg.vocab_size:
        raise ValueError(f"start_token must be a token id in [0, {cfg.vocab_size}), got {start_token!r}")
    check_sampling(temperature, top_k, top_p, cfg.vocab_size)
    prompt_BT = _prompt_batch(prompt, cfg)
    check_context(cfg, prompt_BT.shape[1], what="prompt length")
    graphdef, state = nnx.split(model)
    context_kvs = None
    if cfg.family == "encoder_decoder":
        context_kvs = _encoder(graphdef)(state, prompt_BT)
        first_BT = jnp.full((prompt_BT.shape[0], 1), start_token, jnp.int32)
    else:
        first_BT = prompt_BT
    # the last sampled token is returned, not fed back: the cache holds one position fewer
    length = first_BT.shape[1] + max_new_tokens - 1
    check_context(cfg, length,
                  what=f"prompt ({first_BT.shape[1]} tokens) + max_new_tokens ({max_new_tokens}): cache length")
    cache = KVCache.create(cfg, prompt_BT.shape[0], length, dtype=cache_dtype)
    advance = decode_step(graphdef, temperature, top_k, top_p)
    base_key = jax.random.key(seed)
    tokens, fed_BT = [], first_BT
    stops = np.asarray(list(stop_tokens), np.int64)
    stopped_B = np.zeros(prompt_BT.shape[0], bool)
    for i in range(max_new_tokens):
        fed_BT, cache = advance(state, fed_BT, cache, base_key, i, context_kvs)
        tokens.append(fed_BT)
        if stops.size:  # waits for this token: only where stopping was asked for
            stopped_B |= np.isin(np.asarray(fed_BT[:, 0]), stops)
            if stopped_B.all():
                break
    out_BT = jnp.concatenate(tokens, axis=1)
    if stops.size:
        out_BT = _hold_stop_tokens(np.asarray(out_BT), stops)
    return out_BT[0] if np.ndim(prompt) == 1 else out_BT


def _hold_stop_tokens(tokens_BT: np.ndarray, stops: np.ndarray) -> jax.Array:
    """``tokens_BT`` with every token after a row's first stop token replaced by that stop token."""
    is_stop_BT = np.isin(tokens_BT, stops)
    first_B = np.where(is_stop_BT.any(1), is_stop_BT.argmax(1), tokens_BT.shape[1])
    after_BT = np.arange(tokens_BT.shape[1])[None] > first_B[:, None]
    held_B = tokens_BT[np.arange(len(tokens_BT)), np.minimum(first_B, tokens_BT.shape[1] - 1)]
    return jnp.asarray(np.where(after_BT, held_B[:, None], tokens_BT), jnp.int32)
