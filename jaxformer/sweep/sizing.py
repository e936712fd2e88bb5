"""The size rule: a target parameter count N → a model shape (layers, width, heads).

Rule (documented, deterministic): heads have a fixed width ``head_dim``; the width is a
multiple of it, ``d_model = head_dim · num_heads``; depth follows a fixed aspect ratio
``d_model ≈ aspect_ratio · num_layers`` (Kaplan et al. found loss insensitive to the
ratio over a wide range, so holding it fixed isolates N). For every depth from ``min_layers``
to ``max_layers`` the width whose *exact* count (``jaxformer.accounting``, embeddings and
the output head included unless ``count: non_embedding``) is nearest the target is
found; among those within ``tolerance`` of the target, the shape nearest the aspect
ratio wins, else the nearest count. All other architecture fields come from the base
model config, so N is always the exact count of the model that trains; its grouped-query
attention too: a base with g query heads per K/V head gives shapes of g, 2g, … heads only
(`_head_counts`), never another group.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal

from jaxformer.accounting import count_params
from jaxformer.architecture import ModelConfig, grouped_kv_heads


@dataclasses.dataclass(frozen=True)
class ShapeRule:
    """How a target N becomes a shape. ``count``: which N the targets mean; ``tolerance``: how far from the target,
    as a fraction of it in (0, 1), a shape's count may lie and still be chosen for its aspect ratio."""

    head_dim: int = 16
    aspect_ratio: float = 16.0
    max_layers: int = 12
    min_layers: int = 1
    max_heads: int = 64
    tolerance: float = 0.15
    count: Literal["total", "non_embedding"] = "total"

    def __post_init__(self) -> None:
        for name in ("head_dim", "max_layers", "min_layers", "max_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"shape.{name} must be positive, got {getattr(self, name)}")
        if self.min_layers > self.max_layers:
            raise ValueError(f"shape.min_layers must be at most shape.max_layers ({self.max_layers}), "
                             f"got {self.min_layers}")
        if self.aspect_ratio <= 0:
            raise ValueError(f"shape.aspect_ratio must be positive, got {self.aspect_ratio}")
        # a fraction of the target: at 1 or more, |N / target − 1| ≤ tolerance admits every count below the
        # target (down to one head of min_layers) and `shape_for_params` can no longer refuse a size out of reach
        if not 0 < self.tolerance < 1:
            raise ValueError(f"shape.tolerance must be a fraction of the target size between 0 and 1 "
                             f"(0.15: within 15%), got {self.tolerance}")


def _head_counts(base: ModelConfig, rule: ShapeRule) -> list[int]:
    """The heads a shape of ``base`` may have: up to ``rule.max_heads``, those that keep its query heads per K/V
    head (`grouped_kv_heads`; every count for multi-head attention).

    Raises ``ValueError`` naming ``shape.max_heads`` when it is below one group.
    """
    group = base.num_heads // base.num_kv_heads
    counts = [heads for heads in range(1, rule.max_heads + 1) if grouped_kv_heads(heads, group) is not None]
    if not counts:
        raise ValueError(f"shape.max_heads ({rule.max_heads}) is below the base model's {group} query heads per K/V "
                         "head: no shape keeps its grouped-query attention")
    return counts


def _shape(base: ModelConfig, layers: int, heads: int, rule: ShapeRule) -> ModelConfig:
    """``base`` at this depth and width (``heads`` from `_head_counts`); sizes derived from the width are
    re-derived, the query heads per K/V head kept."""
    return dataclasses.replace(
        base, num_layers=layers, num_heads=heads, head_dim=rule.head_dim, d_model=heads * rule.head_dim,
        num_kv_heads=grouped_kv_heads(heads, base.num_heads // base.num_kv_heads), d_ff=None, expert_d_ff=None,
    )


def _counted(cfg: ModelConfig, rule: ShapeRule) -> int:
    params = count_params(cfg)
    return params.total if rule.count == "total" else params.non_embedding


@functools.lru_cache(maxsize=4096)  # a sweep plans each size at every seed, budget and stage
def shape_for_params(target: float, base: ModelConfig, rule: ShapeRule) -> ModelConfig:
    """The model of ``base``'s architecture whose exact N is nearest ``target`` under ``rule``.

    Raises ``ValueError`` when even ``min_layers`` layers of one head overshoot the target by more
    than the tolerance (the rule would need fewer layers than ``min_layers``), or when even ``max_layers``
    layers of ``max_heads`` heads fall short of it by more than the tolerance (it would need more).
    """
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target params must be a positive number, got {target}")
    head_counts = _head_counts(base, rule)
    candidates = []
    for layers in range(rule.min_layers, rule.max_layers + 1):
        best = min(
            (_shape(base, layers, heads, rule) for heads in head_counts),
            key=lambda cfg: abs(math.log(_counted(cfg, rule) / target)),
        )
        candidates.append(best)
    smallest = _counted(_shape(base, rule.min_layers, head_counts[0], rule), rule)
    if smallest > target * (1 + rule.tolerance):
        layers = "one layer" if rule.min_layers == 1 else f"{rule.min_layers} layers (shape.min_layers)"
        raise ValueError(
            f"shape rule gives too few layers for params={target:.4g}: {layers} of width "
            f"{rule.head_dim * head_counts[0]} already holds {smallest:,} parameters"
        )
    largest = max(_counted(_shape(base, rule.max_layers, heads, rule), rule) for heads in head_counts)
    if largest < target * (1 - rule.tolerance):
        raise ValueError(
            f"shape rule cannot reach params={target:.4g}: {rule.max_layers} layers (shape.max_layers) of up to "
            f"{rule.max_heads} heads (shape.max_heads) of width {rule.head_dim} hold at most {largest:,} parameters"
        )
    close = [cfg for cfg in candidates if abs(_counted(cfg, rule) / target - 1) <= rule.tolerance]
    if close:
        return min(close, key=lambda cfg: abs(math.log(cfg.d_model / (rule.aspect_ratio * cfg.num_layers))))
    return min(candidates, key=lambda cfg: abs(math.log(_counted(cfg, rule) / target)))
