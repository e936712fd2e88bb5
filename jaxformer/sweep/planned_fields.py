"""The fields of a sweep's base config that the planner sets for every run, refused when the spec sets them.

The planner writes each run's shape (`jaxformer.sweep.sizing`: layers, width, heads, head width, FFN widths),
tokens and seed over the base config (`jaxformer.sweep.plan`); a value the spec gave for one of them would be
replaced without a word, so it is refused in one line naming it and what sets it. ``model.num_kv_heads`` is kept:
the size rule keeps the base's query heads per K/V head (``num_heads / num_kv_heads``), so ``num_heads`` is
accepted beside it, as half of that ratio, and refused alone (it would only be replaced).
"""

from __future__ import annotations

from typing import Any

PLANNED_FIELDS = {"train.tokens": "each run's tokens follow from its budget or the grid",
                  "train.seed": "each run's seed comes from the spec's `seeds:` (e.g. seeds: [1])"}

_FFN = "each run's FFN width follows its d_model: 4·d_model, or 8/3·d_model for a gated activation"
# the model fields the size rule sets (`plan.SHAPE_FIELDS` but num_kv_heads, kept as a ratio) -> what sets them
SIZE_FIELDS = {"model.d_model": "the size rule gives each run its width, shape.head_dim × its heads",
               "model.num_layers": "the size rule gives each run its depth, from shape.min_layers to shape.max_layers: "
                                   "set both to fix it",
               "model.num_heads": "the size rule gives each run its heads; with model.num_kv_heads beside it, their "
                                  "ratio, the query heads per K/V head, is kept",
               "model.head_dim": "each run's head width is shape.head_dim",
               "model.d_ff": _FFN, "model.expert_d_ff": _FFN}


def check_planned_fields(base: dict[str, Any], hyperparameters: dict[str, Any]) -> None:
    """Refuses a value in ``base`` or a formula in ``hyperparameters`` for a field the planner sets per run: one
    line naming the first such field and what sets it. ``model.num_heads`` is accepted with ``model.num_kv_heads``.

    (A formula for a size field is checked at planning, `plan._check_shaped`: it may not change the shaped model.)
    """
    for key, why in PLANNED_FIELDS.items():
        section, field = key.split(".")
        given = [f"base.{key}"] if field in (base.get(section) or {}) else []
        given += [f"hyperparameters.{key}"] if key in hyperparameters else []
        if given:
            raise ValueError(f"{given[0]}: the sweep sets it for every run ({why}); remove it")
    model = base.get("model") or {}
    for field in model:  # in the spec's order: the first the user wrote is named
        if f"model.{field}" in SIZE_FIELDS and not (field == "num_heads" and "num_kv_heads" in model):
            raise ValueError(f"base.model.{field}: the sweep sets it for every run ({SIZE_FIELDS[f'model.{field}']}); "
                             "remove it")
