"""Custom-partitioned calls that JAX's persistent compilation cache can find again in another process.

JAX writes a Python object's address into every ``custom_partitioning`` call of a program (its ``backend_config``),
so such a program got a new cache key in every process and was compiled afresh each time (jax-ml/jax#21159): every
multi-device train step with the fused attention or the oneDNN matmul. `jaxformer.runtime.enable_compilation_cache`
turns on ``jax_remove_custom_partitioning_ptr_from_cache_key``, which leaves the address out of the key. What a
call's partition callback depends on beyond its operands' shapes and shardings (its static arguments, the code of
its rules) must then be in the program itself, or two programs differing only there would share one key and one of
them would run the other's code: :func:`partitioning_key` writes both into the call, as a frontend attribute.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from pathlib import Path

from jax.experimental.xla_metadata import set_xla_metadata

ATTRIBUTE = "jaxformer_partitioning"


@functools.cache
def _source_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def partitioning_key(rules_file: str, statics: str) -> contextlib.AbstractContextManager:
    """Context under which a ``custom_partitioning`` call is traced: its custom call carries ``statics`` (the static
    arguments its callbacks read, as text) and a digest of ``rules_file`` (the module defining the callbacks)."""
    return set_xla_metadata(**{ATTRIBUTE: f"{statics}; rules {_source_digest(rules_file)}"})
