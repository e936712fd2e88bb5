"""How a checkpoint's tensors become jaxformer's parameters and back: the one place for layout changes.

Everything that converts between the two layouts is here and is exact (transposes, reshapes,
splits, concatenations and index permutations only), so a round trip reproduces every bit:

- **Linear weights.** PyTorch's ``nn.Linear`` stores ``[out, in]``; jaxformer contracts
  ``x·w`` with ``w [*in, *out]`` (``wq [E, H, D]``, ``wo [H, D, E]``, ``w_in [E, F]``).
  GPT-2's ``Conv1D`` already stores ``[in, out]``.
- **Fused projections.** GPT-2's ``c_attn`` is ``[E, 3E]`` (queries, keys, values side by
  side): split on the way in, concatenated on the way out.
- **RoPE.** jaxformer rotates adjacent coordinate pairs ``(2i, 2i+1)`` of each head
  (`jaxformer.functional.apply_rope`); Hugging Face's Llama family rotates the two halves,
  pairing ``i`` with ``i + D/2``. The attention scores are the same once each head's query
  and key coordinates are permuted, ``ours[2i] = theirs[i]``, ``ours[2i+1] = theirs[i + D/2]``
  (:func:`halves_to_pairs`); values and the output projection are untouched. GGUF files of
  the ``llama`` architecture store q/k already in the pair layout (llama.cpp permutes them).

A `Rule` ties checkpoint tensors to parameters with the two directions of one such change.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

Arrays = Sequence[np.ndarray]


def _pairs_order(head_dim: int) -> np.ndarray:
    """``order[j]``: the rotate-half coordinate that the pair layout puts at ``j``."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    half = head_dim // 2
    return np.stack([np.arange(half), np.arange(half) + half], axis=-1).reshape(head_dim)


def halves_to_pairs(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Permutes a head-dimension axis from rotate-half order (Hugging Face) to adjacent pairs (jaxformer)."""
    return np.take(x, _pairs_order(x.shape[axis]), axis=axis)


def pairs_to_halves(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The inverse of :func:`halves_to_pairs`."""
    return np.take(x, np.argsort(_pairs_order(x.shape[axis])), axis=axis)


@dataclasses.dataclass(frozen=True)
class Rule:
    """Checkpoint tensors ``hf`` ↔ jaxformer parameters ``ours`` (dotted paths of the params state).

    ``load(hf arrays) -> our arrays`` and ``save(our arrays) -> hf arrays`` are inverse and exact.
    """

    hf: tuple[str, ...]
    ours: tuple[str, ...]
    load: Callable[[Arrays], list[np.ndarray]]
    save: Callable[[Arrays], list[np.ndarray]]


def same(hf: str, ours: str, our_shape: Sequence[int], hf_shape: Sequence[int] | None = None) -> Rule:
    """The same numbers in row-major order (norm scales, biases, embedding tables, ``Conv1D`` weights)."""
    our_shape, hf_shape = tuple(our_shape), tuple(our_shape if hf_shape is None else hf_shape)
    return Rule((hf,), (ours,), lambda a: [np.reshape(a[0], our_shape)], lambda a: [np.reshape(a[0], hf_shape)])


def copies(hf: Sequence[str], ours: str, our_shape: Sequence[int], *, read: int = 1) -> Rule:
    """One parameter that a checkpoint holds under several names (an embedding and the copies that transformers
    ties to it only when the head is tied): saved, every name gets it; loaded, the first ``read`` names (those the
    model computes with) must hold the same numbers, and the rest are not read."""
    hf, our_shape = tuple(hf), tuple(our_shape)

    def load(a: Arrays) -> list[np.ndarray]:
        for name, other in zip(hf[1:read], a[1:read]):
            if not np.array_equal(other, a[0]):
                raise ValueError(f"{name} differs from {hf[0]} (jaxformer's {ours} is one array)")
        return [np.reshape(a[0], our_shape)]

    return Rule(hf, (ours,), load, lambda a: [np.asarray(a[0]) for _ in hf])


def linear(hf: str, ours: str, in_shape: Sequence[int], out_shape: Sequence[int], *, rope: bool = False) -> Rule:
    """``nn.Linear.weight [out, in]`` ↔ ``w [*in_shape, *out_shape]``; ``rope``: the last axis is a
    rotated head dimension (queries and keys of the rotate-half families)."""
    in_shape, out_shape = tuple(in_shape), tuple(out_shape)
    n_in, n_out = math.prod(in_shape), math.prod(out_shape)

    def load(a: Arrays) -> list[np.ndarray]:
        w = np.reshape(np.asarray(a[0]).T, in_shape + out_shape)
        return [halves_to_pairs(w) if rope else w]

    def save(a: Arrays) -> list[np.ndarray]:
        w = pairs_to_halves(a[0]) if rope else a[0]
        return [np.ascontiguousarray(np.reshape(w, (n_in, n_out)).T)]

    return Rule((hf,), (ours,), load, save)


def head_bias(hf: str, ours: str, heads: int, head_dim: int, *, rope: bool = False) -> Rule:
    """A projection's bias ``[heads·head_dim]`` ↔ ``[heads, head_dim]`` (permuted like its weight with ``rope``)."""
    def load(a: Arrays) -> list[np.ndarray]:
        b = np.reshape(a[0], (heads, head_dim))
        return [halves_to_pairs(b) if rope else b]

    def save(a: Arrays) -> list[np.ndarray]:
        return [np.reshape(pairs_to_halves(a[0]) if rope else a[0], (heads * head_dim,))]

    return Rule((hf,), (ours,), load, save)


def fused(hf: str, ours: Sequence[str], our_shapes: Sequence[Sequence[int]], *, axis: int) -> Rule:
    """One tensor whose ``axis`` concatenates several parameters (GPT-2's ``c_attn``: q, k, v)."""
    our_shapes = [tuple(s) for s in our_shapes]

    def load(a: Arrays) -> list[np.ndarray]:
        x = np.asarray(a[0])
        widths = [math.prod(s) // math.prod(x.shape[:axis] + x.shape[axis + 1:]) for s in our_shapes]
        parts = np.split(x, np.cumsum(widths)[:-1], axis=axis)
        return [np.reshape(p, s) for p, s in zip(parts, our_shapes)]

    def save(a: Arrays) -> list[np.ndarray]:
        lead = a[0].shape[:axis] if axis else ()
        return [np.concatenate([np.reshape(p, lead + (-1,)) for p in a], axis=axis)]

    return Rule((hf,), tuple(ours), load, save)
