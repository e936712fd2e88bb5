"""`MoE`: the mixture-of-experts FFN sublayer; the math lives in ``jaxformer.functional.moe``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.functional import moe as M
from jaxformer.architecture import ModelConfig
from jaxformer.kernel import KernelConfig
from jaxformer.nn import params


def _expert_stack(cfg: ModelConfig, count: int, axis: str | None, rngs: nnx.Rngs,
                  depth: int) -> dict[str, nnx.Param | None]:
    """``count`` FFNs of width ``cfg.expert_d_ff`` stacked on a leading axis named ``axis``."""
    E, Fh = cfg.d_model, cfg.expert_d_ff
    out_std = params.residual_std(depth)
    bias, gated = cfg.use_bias, cfg.is_gated
    return {
        "w_in_XEF": params.normal(rngs, (count, E, Fh), (axis, "embed", "mlp")),
        "w_gate_XEF": params.normal(rngs, (count, E, Fh), (axis, "embed", "mlp")) if gated else None,
        "w_out_XFE": params.normal(rngs, (count, Fh, E), (axis, "mlp", "embed"), std=out_std),
        "b_in_XF": params.zeros((count, Fh), (axis, "mlp")) if bias else None,
        "b_gate_XF": params.zeros((count, Fh), (axis, "mlp")) if bias and gated else None,
        "b_out_XE": params.zeros((count, E), (axis, "embed")) if bias else None,
    }


def _values(stack: nnx.Dict) -> dict[str, jax.Array | None]:
    return {name: None if p is None else p[...] for name, p in stack.items()}


class MoE(nnx.Module):
    """``[B, T, E] -> ([B, T, E], aux_loss)``: routed experts plus optional shared experts.

    Parameters: ``router [E, X]`` (no bias); ``experts``: X FFNs stacked on an
    "experts" axis (``w_in [X, E, F]``, ``w_out [X, F, E]``, SwiGLU's ``w_gate``, biases
    ``[X, F]``/``[X, E]``); ``shared``: ``cfg.num_shared_experts`` FFNs of the same shape
    that every token passes through (DeepSeekMoE), stacked on an unnamed axis.
    ``aux_loss`` is the unweighted Switch load-balancing loss of this layer.

    ``drop_tokens``: drop assignments past ``cfg.capacity_factor`` (training only); by
    default every assignment is served, so a token's output does not depend on the
    other tokens in the batch and cached decoding equals the full forward. The experts' projections
    compute with ``kernel.matmul_impl``.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, kernel: KernelConfig = KernelConfig(),
                 depth: int | None = None):
        self.cfg = cfg
        self.matmul_impl = kernel.matmul_impl
        self.router = params.normal(rngs, (cfg.d_model, cfg.num_experts), ("embed", "experts"))
        depth = depth or cfg.num_layers  # the layers of its stack, for the residual projections' init
        self.experts = nnx.Dict(_expert_stack(cfg, cfg.num_experts, "experts", rngs, depth))
        shared = cfg.num_shared_experts
        self.shared = nnx.Dict(_expert_stack(cfg, shared, None, rngs, depth)) if shared else None

    def __call__(self, x_BTE: jax.Array, *, drop_tokens: bool = False) -> tuple[jax.Array, jax.Array]:
        B, T, E = x_BTE.shape
        cfg = self.cfg
        x_NE = x_BTE.reshape(B * T, E)
        y_NE, aux_loss = M.moe_feed_forward(
            x_NE, self.router[...], _values(self.experts), k=cfg.experts_per_token, activation=cfg.activation,
            capacity_factor=cfg.capacity_factor if drop_tokens else None, matmul_impl=self.matmul_impl,
        )
        if self.shared is not None:
            # every token through every shared expert: the shared stack (its X = num_shared_experts)
            # is the buffer, tokens broadcast
            x_XNE = jnp.broadcast_to(x_NE, (cfg.num_shared_experts, B * T, E))
            shared_XNE = M.experts_feed_forward(x_XNE, _values(self.shared), cfg.activation,
                                                matmul_impl=self.matmul_impl)
            y_NE = y_NE + jnp.sum(shared_XNE, axis=0)
        return y_NE.reshape(B, T, E), aux_loss
