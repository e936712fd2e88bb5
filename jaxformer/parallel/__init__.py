"""Sharding across devices and hosts: the mesh, the logical→mesh rules table, multi-process start-up.

The model names its parameter dimensions with logical axes and never sees a mesh; this
package decides placement. `Layout` (a ``(data, fsdp, tensor, expert)`` mesh plus the rules
table) gives every array of the train state a ``NamedSharding``; the train step is
``jax.jit`` with those as input and output shardings (pjit semantics), and XLA's GSPMD
partitioner inserts the collectives. Changing ``parallel.mesh`` changes where the work
runs, never the result (to float rounding: ``tests/test_parallel.py``).
"""

import importlib

# name -> the module that defines it. They are imported on first use, so that the ``parallel`` section of a
# config (`jaxformer.parallel.config`) is read without importing JAX and Flax: the sweep's planner does.
_EXPORTS = {"initialize": "distributed", "Layout": "layout", "MESH_AXES": "mesh", "make_mesh": "mesh",
            "mesh_shape": "mesh", "DEFAULT_RULES": "rules", "param_shardings": "rules", "resolve_rules": "rules"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
