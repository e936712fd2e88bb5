"""jaxformer: transformer layers as pure JAX functions, and a scaling-law laboratory on top of them.

``import jaxformer`` is light: sub-packages and :func:`generate` load on first use.
"""

from __future__ import annotations

import importlib

_SUBPACKAGES = ("accounting", "functional", "models", "nn")

__all__ = ["generate", *_SUBPACKAGES]


def __getattr__(name: str):
    if name == "generate":
        from jaxformer.models.generate import generate

        return generate
    if name in _SUBPACKAGES:
        return importlib.import_module(f"jaxformer.{name}")
    raise AttributeError(f"module 'jaxformer' has no attribute {name!r}")
