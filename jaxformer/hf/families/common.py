"""What every family's mapping shares: reading config.json fields, and the checks of an export."""

from __future__ import annotations

from typing import Any

from jaxformer.architecture import ModelConfig

# Hugging Face activation names -> `ModelConfig.activation` (ungated); and back
ACTIVATIONS_IN = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                  "silu": "silu", "swish": "silu"}
ACTIVATIONS_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def field(hf: dict[str, Any], name: str, default: Any = ...) -> Any:
    """``hf[name]``; a missing required field raises one line naming it."""
    if name in hf and hf[name] is not None:
        return hf[name]
    if default is ...:
        raise ValueError(f"config.json: {name} is missing")
    return default


def unsupported(name: str, value: Any, supported: str) -> ValueError:
    return ValueError(f"config.json: {name}={value!r} is not supported (jaxformer supports {supported})")


def expect(hf: dict[str, Any], name: str, wanted: Any, default: Any = None) -> None:
    """Refuses a checkpoint whose ``name`` is set to anything but ``wanted``."""
    value = hf.get(name, default)
    if value is None:
        value = default
    if value != wanted:
        raise unsupported(name, value, f"{name}={wanted!r}")


def activation_in(hf: dict[str, Any], name: str) -> str:
    value = field(hf, name)
    if value not in ACTIVATIONS_IN:
        raise unsupported(name, value, ", ".join(ACTIVATIONS_IN))
    return ACTIVATIONS_IN[value]


def requires(cfg: ModelConfig, target: str, /, **wanted: Any) -> None:
    """Refuses to export ``cfg`` as ``target`` unless every named field has the wanted value (a tuple: one of)."""
    for name, value in wanted.items():
        options = value if isinstance(value, tuple) else (value,)
        if getattr(cfg, name) not in options:
            shown = " or ".join(repr(v) for v in options)
            raise ValueError(f"model.{name}={getattr(cfg, name)!r} has no Hugging Face {target} equivalent "
                             f"(it needs model.{name}={shown})")


def common_requirements(cfg: ModelConfig, family: str) -> None:
    """Options no exported family has: mixtures of experts, sandwich norms, ALiBi…"""
    requires(cfg, family, num_experts=0, norm_position=("pre", "post"))


def norm_rules(prefix: str, ours: str, cfg: ModelConfig, *, layernorm_names=("weight", "bias")):
    """A norm's scale (and LayerNorm's shift)."""
    from jaxformer.hf.layout import same

    rules = [same(f"{prefix}.{layernorm_names[0]}", f"{ours}.scale", (cfg.d_model,))]
    if cfg.norm == "layernorm":
        rules.append(same(f"{prefix}.{layernorm_names[1]}", f"{ours}.bias", (cfg.d_model,)))
    return rules
