"""The rules table and `logical_axes` on an ``nnx.Optimizer``'s state: moments as their parameters, counters apart."""

from __future__ import annotations

import jax
import optax
from flax import nnx
from jax.sharding import AbstractMesh, PartitionSpec

from jaxformer.models import ModelConfig, build_model, init_params, logical_axes
from jaxformer.parallel import DEFAULT_RULES, MESH_AXES
from jaxformer.parallel.rules import param_shardings, spec_for


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
