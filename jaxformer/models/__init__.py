"""Model families built from one `ModelConfig`, and named presets."""

from jaxformer.models.config import ModelConfig
from jaxformer.models.presets import PRESETS, get_preset

__all__ = ["PRESETS", "ModelConfig", "get_preset"]
