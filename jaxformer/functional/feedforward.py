"""Position-wise feed-forward networks: ReLU, GELU (exact or tanh), SiLU and the gated SwiGLU and GEGLU."""

from __future__ import annotations

from typing import Callable

import jax

from jaxformer.functional.dense import dense

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2's gelu_new
    "silu": jax.nn.silu,
    "swiglu": jax.nn.silu,  # the gate's nonlinearity; the up branch stays linear
    "geglu": lambda x: jax.nn.gelu(x, approximate=False),  # GEGLU (Shazeer 2020): an exact-GELU gate
    "geglu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # T5 v1.1's gated-gelu (a gelu_new gate)
}
GATED = frozenset({"swiglu", "geglu", "geglu_tanh"})


def check_activation(activation: str) -> None:
    """Raises one line unless ``activation`` is a key of ``ACTIVATIONS``."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")


def feed_forward(
    x_BTE: jax.Array,
    w_in_EF: jax.Array,
    w_out_FE: jax.Array,
    *,
    activation: str = "gelu",
    w_gate_EF: jax.Array | None = None,
    b_in_F: jax.Array | None = None,
    b_gate_F: jax.Array | None = None,
    b_out_E: jax.Array | None = None,
    matmul_impl: str = "xla",
) -> jax.Array:
    """``act(x·W_in + b_in)·W_out + b_out``; gated: ``(act(x·W_gate + b_gate) ⊙ (x·W_in + b_in))·W_out + b_out``.

    E is the model width, F the hidden width. The gated ones (Shazeer 2020: SwiGLU's SiLU gate,
    GEGLU's GELU gate) need ``w_gate_EF``. ``matmul_impl``: the projections' `dense` impl.
    """
    check_activation(activation)
    hidden_BTF = dense(x_BTE, w_in_EF, impl=matmul_impl)
    if b_in_F is not None:
        hidden_BTF = hidden_BTF + b_in_F
    if activation in GATED:
        if w_gate_EF is None:
            raise ValueError(f"activation {activation!r} needs w_gate_EF")
        gate_BTF = dense(x_BTE, w_gate_EF, impl=matmul_impl)
        if b_gate_F is not None:
            gate_BTF = gate_BTF + b_gate_F
        hidden_BTF = ACTIVATIONS[activation](gate_BTF) * hidden_BTF
    else:
        hidden_BTF = ACTIVATIONS[activation](hidden_BTF)
    out_BTE = dense(hidden_BTF, w_out_FE, impl=matmul_impl)
    return out_BTE if b_out_E is None else out_BTE + b_out_E
