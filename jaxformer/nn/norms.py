"""`Norm`: LayerNorm (scale + shift) or RMSNorm (scale only), chosen by ``cfg.norm``."""

from __future__ import annotations

import jax
from flax import nnx

import jaxformer.functional as F
from jaxformer.architecture import ModelConfig
from jaxformer.nn import params


class Norm(nnx.Module):
    """Normalises ``[..., E]`` over the last axis. Parameters: ``scale [E]`` (+ ``bias [E]`` for LayerNorm)."""

    def __init__(self, cfg: ModelConfig):
        self.kind, self.eps = cfg.norm, cfg.norm_eps
        self.scale = params.ones((cfg.d_model,), ("norm",))
        self.bias = params.zeros((cfg.d_model,), ("norm",)) if cfg.norm == "layernorm" else None

    def __call__(self, x_BTE: jax.Array) -> jax.Array:
        if self.kind == "layernorm":
            return F.layer_norm(x_BTE, self.scale[...], self.bias[...], eps=self.eps)
        return F.rms_norm(x_BTE, self.scale[...], eps=self.eps)
