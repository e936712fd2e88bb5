"""What the PyTorch twin's decoder (`jaxformer.benchmarks.torch_reference.TorchDecoder`) computes as jaxformer does,
and jaxformer's initialisation it draws from; imports neither torch nor JAX, so the launcher can check a plan."""

from __future__ import annotations

from jaxformer.architecture import ModelConfig

# what the twin covers of ModelConfig: anything else is refused before any run starts
POSITIONS = ("learned", "rope", "none")


def unsupported_model(model: ModelConfig) -> str | None:
    """Why `torch_reference.TorchDecoder` cannot compute ``model`` as jaxformer does, in one phrase naming the
    field; None if it can."""
    if model.family != "decoder":
        return f"model.family={model.family!r} (the twin trains decoders only)"
    if model.is_moe:
        return f"model.num_experts={model.num_experts} (the twin is dense)"
    if model.norm_position != "pre":
        return f"model.norm_position={model.norm_position!r} (the twin is pre-norm)"
    if model.position not in POSITIONS:
        return f"model.position={model.position!r} (the twin has {', '.join(POSITIONS)})"
    if model.sliding_window:
        return f"model.sliding_window={model.sliding_window} (the twin attends to the whole context)"
    if model.activation in ("geglu", "geglu_tanh"):
        return f"model.activation={model.activation!r} (the twin's gate is SiLU)"
    if model.attention_scale is not None or model.scale_head_inputs:
        return "model.attention_scale / scale_head_inputs (the twin scales as GPT-2 does)"
    if model.rope_scaling != "none":
        return f"model.rope_scaling={model.rope_scaling!r} (the twin's RoPE frequencies are unscaled)"
    for field in ("embedding_norm", "scale_embeddings", "logit_bias", "num_token_types"):
        if getattr(model, field):
            return f"model.{field}={getattr(model, field)!r} (the twin has none)"
    return None


def jaxformer_init_stds(model: ModelConfig) -> tuple[float, float]:
    """The standard deviations jaxformer draws ``model``'s weights with (`jaxformer.nn.params`): ``(weights and
    embeddings, projections into the residual stream)``. Imports JAX: a twin's parent computes them."""
    from jaxformer.nn.params import INIT_STD, residual_std

    return INIT_STD, residual_std(model.num_layers)
