"""The rules table: logical axes to mesh axes, overrides, the layout's divisibility checks, and `logical_axes` on an
``nnx.Optimizer``'s state (moments as their parameters, counters apart)."""

from __future__ import annotations

import jax
import optax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, PartitionSpec

from jaxformer.models import ModelConfig, build_model, init_params, logical_axes
from jaxformer.nn.params import AXIS_NAMES
from jaxformer.parallel import DEFAULT_RULES, MESH_AXES, Layout, resolve_rules
from jaxformer.parallel.rules import batch_spec, param_shardings, spec_for
from jaxformer.train.config import load_config


def test_an_nnx_optimizers_moments_are_split_as_their_parameters_and_its_count_replicated():
    cfg = ModelConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, max_seq_len=16)
    mesh = AbstractMesh((1, 2, 2, 1), MESH_AXES)
    optimizer = nnx.Optimizer(build_model(cfg, rngs=nnx.Rngs(0)), optax.adamw(1e-3), wrt=nnx.Param)
    specs = jax.tree.map(lambda s: s.spec, param_shardings(nnx.state(optimizer), mesh, DEFAULT_RULES))
    adam = specs["opt_state"][0]
    assert adam["count"] == PartitionSpec()
    # each moment: the spec of its parameter's logical axes and shape, as optax's moments of the pure view get
    _, params = init_params(cfg, 0)
    expected = jax.tree.map(lambda p: spec_for(tuple(p.get_metadata()["out_sharding"]), p.shape, mesh,
                                               DEFAULT_RULES), params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    pure = jax.tree.map(lambda s: s.spec, param_shardings(optax.adamw(1e-3).init(params), mesh, DEFAULT_RULES))
    expected = nnx.to_pure_dict(expected)
    for moment in ("mu", "nu"):
        assert nnx.to_pure_dict(adam[moment]) == expected == nnx.to_pure_dict(getattr(pure[0], moment))
    attention = expected["decoder"]["blocks"][0]["attention"]
    assert attention["wq"] == attention["wk"] == PartitionSpec("fsdp", "tensor", None)


def test_logical_axes_of_an_nnx_optimizers_state_give_moments_their_parameters_axes_and_the_count_none():
    cfg = ModelConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, max_seq_len=16)
    optimizer = nnx.Optimizer(build_model(cfg, rngs=nnx.Rngs(0)), optax.adamw(1e-3), wrt=nnx.Param)
    state = nnx.state(optimizer)
    axes = logical_axes(state)  # raised KeyError: 'out_sharding' at the step count
    adam = axes["opt_state"][0]
    assert axes["step"] == adam["count"] == ()  # scalars: no dimension to name
    params_axes = nnx.to_pure_dict(logical_axes(init_params(cfg, 0)[1]))
    assert nnx.to_pure_dict(adam["mu"]) == nnx.to_pure_dict(adam["nu"]) == params_axes
    assert params_axes["decoder"]["blocks"][0]["attention"]["wq"] == ("embed", "heads", "head_dim")
    # the placement param_shardings gives each leaf is the spec of the names logical_axes reports
    mesh = AbstractMesh((1, 2, 2, 1), MESH_AXES)
    specs = jax.tree.map(lambda s: s.spec, param_shardings(state, mesh, DEFAULT_RULES))
    from_axes = jax.tree.map(lambda names, leaf: spec_for(names, leaf.shape, mesh, DEFAULT_RULES), axes, state,
                             is_leaf=lambda x: isinstance(x, tuple))
    assert nnx.to_pure_dict(specs) == nnx.to_pure_dict(from_axes)


def test_rules_map_logical_axes_replicate_what_does_not_divide_and_never_reuse_a_mesh_axis():
    assert list(DEFAULT_RULES) == ["batch", *AXIS_NAMES]  # a rule for every name a parameter carries, no other
    mesh = AbstractMesh((2, 2, 4, 1), MESH_AXES)
    assert spec_for(("embed", "heads", "head_dim"), (32, 8, 16), mesh, DEFAULT_RULES) == PartitionSpec(
        "fsdp", "tensor", None)
    assert spec_for(("embed", "kv_heads", "head_dim"), (32, 2, 16), mesh, DEFAULT_RULES) == PartitionSpec(
        "fsdp", None, None)  # 2 kv heads on a tensor axis of 4: replicated
    assert spec_for(("vocab", "embed"), (250, 32), mesh, DEFAULT_RULES) == PartitionSpec(None, "fsdp")
    # an axis of size 1 (expert here) is left out of the specs: experts unsplit, the batch over data × fsdp only
    assert spec_for(("experts", "embed", "mlp"), (4, 32, 96), mesh, DEFAULT_RULES) == PartitionSpec(
        None, "fsdp", "tensor")
    assert batch_spec(3, 1, mesh, DEFAULT_RULES) == PartitionSpec(None, ("data", "fsdp"), None)
    both_fsdp = {**DEFAULT_RULES, "vocab": ("fsdp",)}
    assert spec_for(("vocab", "embed"), (256, 32), mesh, both_fsdp) == PartitionSpec("fsdp", None)
    overridden = resolve_rules(load_config(None, ["parallel.rules.embed=null", "parallel.rules.mlp=[tensor,fsdp]"])
                               .parallel.rules)
    assert spec_for(("embed", "mlp"), (32, 96), mesh, overridden) == PartitionSpec(None, ("tensor", "fsdp"))
    with pytest.raises(ValueError, match=r"parallel.rules.embedding: unknown logical axis"):
        resolve_rules({"embedding": "fsdp"})
    with pytest.raises(ValueError, match=r"parallel.rules.mlp: 'tensr' is not a mesh axis"):
        resolve_rules({"mlp": ["tensr"]})
    with pytest.raises(ValueError, match=r"^parallel.rules.embed must be a mesh axis, a list of them or null, got 5$"):
        resolve_rules({"embed": 5})
    layout = Layout(mesh, DEFAULT_RULES)
    assert layout.batch_shards == 4  # data × fsdp × expert
    layout.check(load_config(None, ["model.num_heads=8"]).model, micro_batch=8)
    with pytest.raises(ValueError, match=r"^model.num_heads=6 is not divisible by parallel.mesh.tensor=4$"):
        layout.check(load_config(None, ["model.d_model=48", "model.num_heads=6"]).model, micro_batch=8)
    # FSDP's axis (the model width, with the default rules) would otherwise be replicated, its memory saving lost
    with pytest.raises(ValueError, match=r"^model.d_model=45 is not divisible by parallel.mesh.fsdp=2$"):
        layout.check(load_config(None, ["model.d_model=45", "model.num_heads=8", "model.head_dim=8"]).model,
                     micro_batch=8)  # heads and MLP width (8, 120) divide
