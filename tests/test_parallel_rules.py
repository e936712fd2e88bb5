"""The rules table on the state of an ``nnx.Optimizer``: moments split as their parameters, the step count
replicated."""

from __future__ import annotations

import jax
import optax
from flax import nnx
from jax.sharding import AbstractMesh, PartitionSpec

from jaxformer.models import ModelConfig, build_model, init_params
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
    for moment in ("mu", "nu"):
        assert nnx.to_pure_dict(adam[moment]) == nnx.to_pure_dict(expected) == nnx.to_pure_dict(getattr(pure[0], moment))
    assert nnx.to_pure_dict(expected)["decoder"]["blocks"][0]["attention"]["wq"] == PartitionSpec("fsdp", "tensor", None)
    assert nnx.to_pure_dict(expected)["decoder"]["blocks"][0]["attention"]["wk"] == PartitionSpec("fsdp", "tensor", None)
