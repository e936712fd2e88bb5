"""Position signals: absolute sinusoids, rotary embeddings (RoPE), ALiBi biases and T5's relative position buckets."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from jaxformer.checks import require_positive
from jaxformer.functional.masks import query_key_distance


def _inverse_frequencies(dim: int, base: float, dtype=jnp.float32) -> jax.Array:
    """``[dim // 2]`` frequencies ``base^(-2i/dim)``."""
    return base ** (-jnp.arange(0, dim, 2, dtype=dtype) / dim)


def sinusoidal_positions(num_positions: int, dim: int, *, base: float = 10000.0, dtype: DTypeLike = jnp.float32,
                         split: bool = False) -> jax.Array:
    """``[num_positions, dim]`` table with ``PE[p, 2i] = sin(p·ω_i)``, ``PE[p, 2i+1] = cos(p·ω_i)``.

    ``ω_i = base^(-2i/dim)`` radians per position (Vaswani et al. 2017). ``PE_p · PE_{p+k}`` depends only on k.
    ``split``: the same values laid out as all sines then all cosines,
    ``PE[p, i] = sin(p·ω_i)``, ``PE[p, dim/2 + i] = cos(p·ω_i)`` (Marian, fairseq).
    ``dtype``: the table's; positions and angles are computed in at least float32 (float64 when
    asked for), as `apply_rope` does, and the values rounded to ``dtype`` at the end.
    """
    require_positive("num_positions", num_positions)
    require_positive("dim", dim, even=True)
    compute_dtype = jnp.promote_types(dtype, jnp.float32)  # bf16 holds positions exactly only up to 256
    with jax.ensure_compile_time_eval():  # a constant of the compiled program, as RoPE's tables (apply_rope)
        angles_PJ = (jnp.arange(num_positions, dtype=compute_dtype)[:, None]
                     * _inverse_frequencies(dim, base, compute_dtype)[None])
        if split:
            table_PE = jnp.concatenate([jnp.sin(angles_PJ), jnp.cos(angles_PJ)], axis=-1)
        else:
            table_PE = jnp.stack([jnp.sin(angles_PJ), jnp.cos(angles_PJ)], axis=-1).reshape(num_positions, dim)
        return table_PE.astype(dtype)


def rope_frequencies(head_dim: int, base: float = 10000.0, *, llama3: tuple[float, float, float, int] | None = None
                     ) -> np.ndarray:
    """``[J]`` (``J = head_dim // 2``) RoPE frequencies ``ω_i = base^(-2i/head_dim)`` in radians per position
    (float32, a constant).

    ``llama3 = (factor, low_freq_factor, high_freq_factor, original_max_len)``: Llama 3.1's
    rescaling. Wavelengths ``2π/ω`` above ``original_max_len / low_freq_factor`` are slowed by
    ``factor``, those below ``original_max_len / high_freq_factor`` kept, and those between
    interpolated: ``ω·((1 - s)/factor + s)``, ``s = (original_max_len·ω/2π - low) / (high - low)``.
    """
    require_positive("head_dim", head_dim, even=True)
    omega_J = (1.0 / (np.float32(base) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))))
    omega_J = omega_J.astype(np.float32)
    if llama3 is None:
        return omega_J
    factor, low, high, original = llama3
    if high <= low:
        raise ValueError(f"llama3 RoPE scaling needs high_freq_factor > low_freq_factor, got {high} <= {low}")
    wavelength_J = 2 * math.pi / omega_J
    scaled_J = np.where(wavelength_J > original / low, omega_J / factor, omega_J)
    smooth_J = (original / wavelength_J - low) / (high - low)
    smoothed_J = (1 - smooth_J) * scaled_J / factor + smooth_J * scaled_J
    medium_J = (wavelength_J >= original / high) & (wavelength_J <= original / low)
    return np.where(medium_J, smoothed_J, scaled_J).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, *, base: float = 10000.0, scale: float = 1.0,
               frequencies: jax.Array | np.ndarray | None = None) -> jax.Array:
    """Rotates consecutive coordinate pairs ``(2i, 2i+1)`` of ``x`` by ``position·scale·ω_i``.

    Args:
      x: ``[..., T, H, D]`` queries or keys (D even).
      positions: ``[T]`` or ``[B, T]`` absolute positions (integers or floats).
      scale: multiplies the positions; ``scale < 1`` is position interpolation
        (Chen et al. 2023), squeezing longer contexts into the trained range.
      frequencies: ``[D // 2]`` frequencies ``ω`` to use instead of ``base^(-2i/D)``
        (e.g. :func:`rope_frequencies` with Llama 3.1's scaling).

    Pairs are adjacent coordinates; checkpoints that rotate the two halves of each head
    (Hugging Face's ``rotate_half``) are the same function after a fixed permutation of each
    head's query/key coordinates (`jaxformer.hf.layout`).

    Returns ``x`` rotated, same shape and dtype. Scores of rotated queries and keys
    depend on positions only through their difference.
    """
    if x.ndim < 3:
        raise ValueError(f"x must have shape [..., seq, heads, head_dim], got {x.shape}")
    head_dim = x.shape[-1]
    require_positive("head_dim", head_dim, even=True)
    compute_dtype = jnp.promote_types(x.dtype, jnp.float32)  # at least fp32 angles, fp64 when enabled
    if jnp.shape(positions)[-1] != x.shape[-3]:
        raise ValueError(f"positions length {jnp.shape(positions)[-1]} does not match sequence length {x.shape[-3]}")
    # Concrete positions (training, prefill) make the cos/sin tables constants of the compiled
    # program. Computed inside it, XLA:CPU fuses them into every consumer and evaluates scalar
    # sin/cos per element of [B, T, H, J] (J = D/2), forward and backward, instead of once per
    # [T, J] (docs/cpu-speed.md, change 7). Traced positions (decoding offsets) are computed in the program.
    with jax.ensure_compile_time_eval():
        scaled_T = jnp.asarray(positions, dtype=compute_dtype) * scale
        omega_J = (_inverse_frequencies(head_dim, base, compute_dtype) if frequencies is None
                   else jnp.asarray(frequencies, compute_dtype))
        if omega_J.shape != (head_dim // 2,):
            raise ValueError(f"frequencies must have shape ({head_dim // 2},), got {omega_J.shape}")
        angles_TJ = scaled_T[..., :, None] * omega_J
        cos_T1J, sin_T1J = jnp.cos(angles_TJ)[..., None, :], jnp.sin(angles_TJ)[..., None, :]
    pairs = x.astype(compute_dtype).reshape(*x.shape[:-1], head_dim // 2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([even * cos_T1J - odd * sin_T1J, even * sin_T1J + odd * cos_T1J], axis=-1)
    return rotated.reshape(x.shape).astype(x.dtype)


def alibi_slopes(num_heads: int) -> jax.Array:
    """``[H]`` geometric ALiBi slopes (Press et al. 2022), score units per position of distance: 1/2 … 1/256 for
    8 heads.

    For a head count that is not a power of two, the slopes of the next power down are
    followed by every other slope of the power up, as in the reference implementation.
    """
    require_positive("num_heads", num_heads)

    def power_of_two_slopes(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    lower = 2 ** (num_heads.bit_length() - 1)
    slopes = power_of_two_slopes(lower)
    if lower != num_heads:
        slopes += power_of_two_slopes(2 * lower)[0::2][: num_heads - lower]
    return jnp.asarray(slopes, dtype=jnp.float32)


def alibi_bias(num_heads: int, q_len: int, k_len: int, *, offset: int = 0) -> jax.Array:
    """``[num_heads, q_len, k_len]`` bias ``-m_h·|i + offset - j|``, added after the 1/sqrt(d) scaling.

    Combine with :func:`causal_mask` for a decoder; the bias alone is the symmetric
    (bidirectional) form.
    """
    return alibi_bias_from_slopes(alibi_slopes(num_heads), q_len, k_len, offset=offset)


def alibi_bias_from_slopes(slopes_H: jax.Array, q_len: int, k_len: int, *, offset: int | jax.Array = 0) -> jax.Array:
    """``[H, q_len, k_len]`` bias ``-slopes_H[h]·|i + offset - j|`` for any ``[H]`` slopes.

    ``offset`` may be traced, so a tile of keys starting at ``j0`` uses ``offset - j0``.
    """
    slopes_H = jnp.asarray(slopes_H)
    slopes_H = slopes_H.astype(jnp.promote_types(slopes_H.dtype, jnp.float32))
    distance_TS = jnp.abs(query_key_distance(q_len, k_len, offset))
    return -slopes_H[:, None, None] * distance_TS[None].astype(slopes_H.dtype)


def _bucket_table(num_buckets: int, max_distance: int) -> np.ndarray:
    """``[max_distance + 1]`` buckets of distances ``0 … max_distance`` within one direction (a constant).

    The first ``num_buckets // 2`` distances have a bucket each; the rest are spaced logarithmically up to
    ``max_distance``, and every distance from there on shares the last bucket. Computed once in float64,
    so a distance whose bucket boundary is exact (16 of 128 with 16 buckets) never lands one below it.
    """
    exact = num_buckets // 2
    if exact < 1 or max_distance <= exact:
        raise ValueError(f"relative position buckets: {num_buckets} per direction need max_distance above "
                         f"{max(exact, 0)} and at least 2 buckets, got max_distance={max_distance}")
    n = np.arange(max_distance + 1)
    with np.errstate(divide="ignore"):
        large = exact + (np.log(np.maximum(n, 1) / exact) / math.log(max_distance / exact)
                         * (num_buckets - exact)).astype(np.int64)
    return np.where(n < exact, n, np.minimum(large, num_buckets - 1)).astype(np.int32)


def relative_position_buckets(distance: jax.Array, *, num_buckets: int, max_distance: int,
                              bidirectional: bool) -> jax.Array:
    """T5's bucket (Raffel et al. 2020) of each query–key distance ``(i + offset) - j``, in ``[0, num_buckets)``.

    ``distance`` is any integer array (``[T, S]`` from the query and key positions); ``distance > 0``
    means the key comes before the query. Bidirectional (an encoder): half the buckets for keys at or
    before the query, half for keys after it. Unidirectional (causal): every key after the query
    shares bucket 0 with the query itself (they are masked anyway). Within a direction, distances
    below half its buckets have one bucket each, the rest logarithmic bins up to ``max_distance``,
    past which all distances share the last bucket. ``distance`` may be traced.
    """
    distance = jnp.asarray(distance)
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    lookup = jnp.asarray(_bucket_table(per_direction, int(max_distance)))
    if bidirectional:
        n = jnp.abs(distance)
        offset = jnp.where(distance < 0, per_direction, 0)
    else:
        n, offset = jnp.maximum(distance, 0), 0
    return (lookup[jnp.minimum(n, max_distance)] + offset).astype(jnp.int32)


def relative_position_bias(table_PH: jax.Array, q_len: int, k_len: int, *, offset: int | jax.Array = 0,
                           bidirectional: bool = True, max_distance: int = 128) -> jax.Array:
    """``[H, q_len, k_len]`` T5 bias ``table_PH[bucket(i + offset - j), h]``, added to the scores.

    ``table_PH``: ``[P, H]`` learned bias per bucket (``P = num_buckets``) and head;
    buckets from :func:`relative_position_buckets`. ``offset`` (the position of query 0) may be
    traced, so a tile of keys starting at ``j0`` uses ``offset - j0``, as ALiBi does.
    """
    table_PH = jnp.asarray(table_PH)
    distance_TS = query_key_distance(q_len, k_len, offset)
    buckets_TS = relative_position_buckets(distance_TS, num_buckets=table_PH.shape[0], max_distance=max_distance,
                                           bidirectional=bidirectional)
    return jnp.moveaxis(table_PH[buckets_TS], -1, 0).astype(jnp.promote_types(table_PH.dtype, jnp.float32))
