"""The device mesh: four named axes sized from ``parallel.mesh``, one of them possibly -1 (the rest).

Axis order is ``(data, fsdp, tensor, expert)``, outermost first: ``jax.make_mesh`` lays
the innermost axes over the closest devices (same host, same ICI/NVLink neighbourhood),
so tensor and expert parallelism, which talk every layer, get the fastest links and data
parallelism, which talks once per step, the slowest. Every axis is ``AxisType.Auto``
(JAX ≥ 0.10 defaults to Explicit): shardings are set on inputs and outputs of the jitted
step and XLA's GSPMD partitioner propagates them through the model, which never names a
mesh axis.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
from jax.sharding import AxisType, Mesh

MESH_AXES = ("data", "fsdp", "tensor", "expert")


def mesh_shape(sizes: Mapping[str, int], device_count: int) -> dict[str, int]:
    """``{axis: size}`` for ``MESH_AXES`` with the -1 axis (if any) filled; the product is ``device_count``.

    Raises ``ValueError`` naming both numbers when the sizes cannot cover the devices.
    """
    sizes = {axis: int(sizes[axis]) for axis in MESH_AXES}
    named = " × ".join(f"{axis}={size}" for axis, size in sizes.items())
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if -1 in sizes.values():
        if device_count % fixed:
            raise ValueError(f"parallel.mesh {named}: the fixed axes multiply to {fixed}, "
                             f"which does not divide the {device_count} devices")
        return {axis: device_count // fixed if size == -1 else size for axis, size in sizes.items()}
    if fixed != device_count:
        raise ValueError(f"parallel.mesh {named} multiplies to {fixed} devices, but there are {device_count}")
    return sizes


def make_mesh(sizes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The ``(data, fsdp, tensor, expert)`` mesh over ``devices`` (default: all devices of all processes)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(sizes, len(devices))
    return jax.make_mesh(tuple(shape[axis] for axis in MESH_AXES), MESH_AXES,
                         axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)
