"""`dense`: a weight contraction computed as one 2-D matmul over all leading positions.

Every projection of the model (queries/keys/values, attention output, FFN, output head)
goes through it. Flattening ``[B, T, ...]`` to ``[B·T, ...]`` is what makes the backward
pass fast on XLA:CPU: the weight gradient ``xᵀ·dy`` then contracts one axis of 2-D
operands, which the dot kernel takes as it is, whereas contracting the two axes ``(B, T)``
of 3-D operands made XLA write transposed copies of both (with the producing elementwise
work recomputed in transposed order); the measured effect is in docs/cpu-speed.md
(change 4). Sharding is unaffected: the merged ``B·T`` axis keeps ``B``'s.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from jaxformer.functional import onednn_matmul
from jaxformer.kernel import MATMUL_IMPLS


def check_matmul_impl(impl: str) -> None:
    """Raises one line unless ``impl`` is a matmul implementation a model can be built with (not ``auto``)."""
    if impl == "auto":
        raise ValueError("matmul_impl 'auto' is chosen per run by training (jaxformer.train.matmul_choice); "
                         f"a model built directly needs one of {MATMUL_IMPLS}")
    if impl not in MATMUL_IMPLS:
        raise ValueError(f"matmul_impl must be one of {MATMUL_IMPLS}, got {impl!r}")


def dense(x: jax.Array, w: jax.Array, *, in_axes: int = 1, preferred_element_type: DTypeLike | None = None,
          impl: str = "xla") -> jax.Array:
    """Contracts the last ``in_axes`` axes of ``x`` with the first ``in_axes`` axes of ``w``.

    Args:
      x: ``[..., *I]`` activations (e.g. ``[B, T, E]``, or ``[B, T, H, D]`` with ``in_axes=2``).
      w: ``[*I, *O]`` weights (e.g. ``[E, H, D]``, ``[E, F]``, ``[H, D, E]``).
      preferred_element_type: the matmul's accumulation/output dtype (as in ``jnp.matmul``).
      impl: ``xla`` (``jnp.matmul``) or ``onednn``: bf16 or fp32 operands on a CPU go through
        oneDNN's matmul (`jaxformer.functional.onednn_matmul`); anything it does not take (mixed
        dtypes, a bf16 result of fp32 operands), or a machine where it is unavailable, computes with
        ``jnp.matmul``. ``onednn`` has no forward mode (``jax.jvp``, ``jax.jacfwd`` raise: its gradient is a
        ``jax.custom_vjp``); ``jax.vmap`` and derivatives of its gradient work.

    Returns ``[..., *O]``: ``y[n, o] = Σ_i x[n, i]·w[i, o]``.
    """
    in_shape, out_shape = w.shape[:in_axes], w.shape[in_axes:]
    if x.shape[x.ndim - in_axes:] != in_shape:
        raise ValueError(f"dense: x's last {in_axes} axes {x.shape[x.ndim - in_axes:]} must equal w's first {in_shape}")
    check_matmul_impl(impl)
    lead = x.shape[:x.ndim - in_axes]
    fan_in = math.prod(in_shape)
    x_NI, w_IO = x.reshape(math.prod(lead), fan_in), w.reshape(fan_in, math.prod(out_shape))  # no -1: sizes may be 0
    out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(x, w))
    if impl == "onednn" and onednn_matmul.supports(x_NI, w_IO, out_dtype):
        y_NO = onednn_matmul.matmul(x_NI, w_IO, out_dtype)
    else:
        y_NO = jnp.matmul(x_NI, w_IO, preferred_element_type=preferred_element_type)
    return y_NO.reshape(*lead, *out_shape)
