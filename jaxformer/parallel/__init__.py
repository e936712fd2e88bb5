"""Sharding across devices and hosts: the mesh, the logical→mesh rules table, multi-process start-up.

The model names its parameter dimensions with logical axes and never sees a mesh; this
package decides placement. `Layout` (a ``(data, fsdp, tensor, expert)`` mesh plus the rules
table) gives every array of the train state a ``NamedSharding``; the train step is
``jax.jit`` with those as input and output shardings (pjit semantics), and XLA's GSPMD
partitioner inserts the collectives. Changing ``parallel.mesh`` changes where the work
runs, never the result (to float rounding: ``tests/test_parallel.py``).
"""

from jaxformer.parallel.distributed import initialize
from jaxformer.parallel.layout import Layout
from jaxformer.parallel.mesh import MESH_AXES, make_mesh, mesh_shape
from jaxformer.parallel.rules import DEFAULT_RULES, param_shardings, resolve_rules

__all__ = ["DEFAULT_RULES", "MESH_AXES", "Layout", "initialize", "make_mesh", "mesh_shape", "param_shardings",
           "resolve_rules"]
