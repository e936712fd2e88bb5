"""The one scalar argument check of the library functions: a count or size that must be positive.

Imports nothing, so the JAX-free layers (`jaxformer.accounting`, ``jaxformer count``) use it
as well as `jaxformer.functional`. Config fields declare their ranges instead
(`jaxformer.configs.Range`); data tables check their arrays themselves (`jaxformer.scaling.table`).
"""

from __future__ import annotations


def require_positive(name: str, value, *, even: bool = False) -> None:
    """Raises ``ValueError`` naming ``name`` unless ``value > 0`` (and, with ``even``, even)."""
    if even:
        if value <= 0 or value % 2:
            raise ValueError(f"{name} must be a positive even number, got {value}")
    elif value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
