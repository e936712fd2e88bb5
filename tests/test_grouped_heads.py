"""A resized model's query heads per K/V head: one rule (`grouped_kv_heads`) for a preset given new heads and for
the sweep's size rule — the group is kept, and heads it does not divide are refused or never chosen."""

from __future__ import annotations

import pytest

from jaxformer.architecture import grouped_kv_heads
from jaxformer.models.presets import model_config_from_dict
from jaxformer.sweep.sizing import ShapeRule, shape_for_params


def test_grouped_kv_heads_keeps_the_group_or_says_it_does_not_divide():
    assert [grouped_kv_heads(heads, 4) for heads in (4, 8, 32, 5, 6, 2)] == [1, 2, 8, None, None, None]
    assert [grouped_kv_heads(heads, 1) for heads in (1, 5, 7)] == [1, 5, 7]  # multi-head: every count


def test_the_size_rule_keeps_the_bases_query_heads_per_kv_head():
    """A base of 4 query heads per K/V head planned 3e5 parameters as 5 heads of multi-head attention (5 K/V heads,
    not 1.25): its ladder mixed two attention designs. Every shape now has a multiple of 4 heads, a quarter of
    them K/V heads, and is the model a preset given those heads becomes."""
    base = model_config_from_dict({"preset": "tiny", "num_heads": 4, "num_kv_heads": 1})
    rule = ShapeRule()
    shapes = [shape_for_params(target, base, rule) for target in (2e5, 3e5, 1e6, 3e6)]
    assert [(shape.num_heads, shape.num_kv_heads) for shape in shapes[:2]] == [(4, 1), (4, 1)]  # was (4, 1), (5, 5)
    for shape in shapes:
        assert shape.num_heads % 4 == 0 and shape.num_kv_heads * 4 == shape.num_heads
    llama = model_config_from_dict({"preset": "llama3-8b", "vocab_size": 256})
    for target in (3e5, 1e6):
        shape = shape_for_params(target, llama, ShapeRule(head_dim=16, max_heads=24))
        resized = model_config_from_dict({"preset": "llama3-8b", "vocab_size": 256, "num_heads": shape.num_heads,
                                          "d_model": shape.d_model, "head_dim": 16})
        assert shape.num_kv_heads == resized.num_kv_heads == shape.num_heads // 4, target


def test_a_size_rule_with_fewer_heads_than_one_group_is_refused_naming_max_heads():
    base = model_config_from_dict({"preset": "tiny", "num_heads": 4, "num_kv_heads": 1})
    with pytest.raises(ValueError, match=r"^shape.max_heads \(3\) is below the base model's 4 query heads per K/V "
                                         r"head: no shape keeps its grouped-query attention$"):
        shape_for_params(1e5, base, ShapeRule(max_heads=3))
