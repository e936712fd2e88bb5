"""Model families built from one `ModelConfig`, and named presets.

`ModelConfig` and the presets import without Flax (``jaxformer count`` needs only
them); the modules and the pure view are imported on first use.
"""

from __future__ import annotations

import importlib

from jaxformer.architecture import ModelConfig
from jaxformer.models.presets import PRESETS, get_preset

_LAZY = {
    "build_model": "jaxformer.models.build",
    "DecoderLM": "jaxformer.models.decoder",
    "EncoderMLM": "jaxformer.models.encoder",
    "EncoderDecoder": "jaxformer.models.encoder_decoder",
    "KVCache": "jaxformer.models.kv_cache",
    "init_params": "jaxformer.models.pure",
    "apply": "jaxformer.models.pure",
    "logical_axes": "jaxformer.models.pure",
    "embed": "jaxformer.models.encoder",
}

__all__ = ["PRESETS", "ModelConfig", "get_preset", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxformer.models' has no attribute {name!r}")
