"""One module per checkpoint family: its config mapping, its weight `Rule`s and its export checks.

Each module has ``MODEL_TYPES``, ``PREFIX`` (the base-model prefix that bare checkpoints lack),
``IGNORED`` (tensors that carry nothing jaxformer needs: buffers, tied copies), ``TIED`` (each tied copy's
original: a checkpoint of a tied model holding a copy that differs is refused),
``to_config(config_json, tensor_names)``, ``rules(cfg)``, ``check_export(cfg)`` and ``hf_config(cfg)``.
"""

from __future__ import annotations

from types import ModuleType

from jaxformer.architecture import ModelConfig
from jaxformer.hf.families import bert, gpt2, llama, marian, t5

FAMILIES: tuple[ModuleType, ...] = (gpt2, llama, bert, marian, t5)
BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.MODEL_TYPES}


def for_model_type(model_type: str | None) -> ModuleType:
    if model_type not in BY_MODEL_TYPE:
        raise ValueError(f"config.json: model_type={model_type!r} is not supported "
                         f"(supported: {', '.join(sorted(BY_MODEL_TYPE))})")
    return BY_MODEL_TYPE[model_type]


def for_config(cfg: ModelConfig) -> ModuleType:
    """The family a jaxformer model is exported as (then ``check_export`` says whether it can be)."""
    if cfg.family == "encoder":
        return bert
    if cfg.family == "encoder_decoder":  # T5's relative position biases, else Marian's sinusoids
        return t5 if cfg.position == "relative_bias" else marian
    if cfg.position == "learned":
        return gpt2
    if cfg.position == "rope":
        return llama
    raise ValueError(f"model.position={cfg.position!r}: no Hugging Face decoder family to export it as "
                     "(learned positions export as GPT-2, rope as Llama/Mistral/Qwen2)")


def auto_class(cfg: ModelConfig) -> str:
    """The ``transformers`` Auto class that loads the export."""
    family = for_config(cfg)
    return bert.architecture(cfg)[1] if family is bert else family.AUTO_CLASS
