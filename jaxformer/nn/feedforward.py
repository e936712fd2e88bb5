"""`FeedForward`: the dense position-wise FFN (relu / gelu / swiglu) around ``F.feed_forward``."""

from __future__ import annotations

import jax
from flax import nnx

import jaxformer.functional as F
from jaxformer.architecture import ModelConfig
from jaxformer.kernel import KernelConfig
from jaxformer.nn import params


class FeedForward(nnx.Module):
    """``[B, T, E] -> [B, T, E]`` through a hidden width ``cfg.d_ff``.

    Parameters: ``w_in [E, F]``, ``w_out [F, E]``, SwiGLU's ``w_gate [E, F]``; with
    ``cfg.use_bias`` also ``b_in [F]``, ``b_out [E]`` and (SwiGLU) ``b_gate [F]``. The projections
    compute with ``kernel.matmul_impl``.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, kernel: KernelConfig = KernelConfig(),
                 depth: int | None = None):
        E, Fh = cfg.d_model, cfg.d_ff
        self.matmul_impl = kernel.matmul_impl
        self.activation = cfg.activation
        self.w_in = params.normal(rngs, (E, Fh), ("embed", "mlp"))
        self.w_gate = params.normal(rngs, (E, Fh), ("embed", "mlp")) if cfg.is_gated else None
        out_std = params.residual_std(depth or cfg.num_layers)  # depth: the layers of its stack
        self.w_out = params.normal(rngs, (Fh, E), ("mlp", "embed"), std=out_std)
        self.b_in = params.zeros((Fh,), ("mlp",)) if cfg.use_bias else None
        self.b_gate = params.zeros((Fh,), ("mlp",)) if cfg.use_bias and cfg.is_gated else None
        self.b_out = params.zeros((E,), ("embed",)) if cfg.use_bias else None

    def __call__(self, x_BTE: jax.Array) -> jax.Array:
        value = lambda p: None if p is None else p[...]  # noqa: E731
        return F.feed_forward(
            x_BTE, self.w_in[...], self.w_out[...], activation=self.activation, w_gate_EF=value(self.w_gate),
            b_in_F=value(self.b_in), b_gate_F=value(self.b_gate), b_out_E=value(self.b_out), matmul_impl=self.matmul_impl,
        )
