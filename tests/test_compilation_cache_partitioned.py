"""JAX's persistent compilation cache serves multi-device programs whose fused attention and oneDNN matmul calls are
custom-partitioned (they were compiled afresh in every process: the calls' Python addresses were in the key), and
two programs that differ only in a call's static arguments keep two keys."""

import json
import os

import numpy as np
import pytest

from jaxformer.functional import fused_attention, onednn_matmul
from model_helpers import run_python

# one process: two devices, a batch-sharded program of a oneDNN matmul into the fused attention (causal or not);
# prints how many of its programs the persistent cache served and how many it missed, and the result
SCRIPT = """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec
    from jaxformer.functional.fused_attention import fused_attention, fused_available
    from jaxformer.functional.onednn_matmul import matmul, onednn_available
    from jaxformer.runtime import enable_compilation_cache

    assert fused_available() and onednn_available()  # each registers its kernel with XLA
    enable_compilation_cache(sys.argv[1])
    cache = {"/jax/compilation_cache/cache_hits": 0, "/jax/compilation_cache/cache_misses": 0}
    jax.monitoring.register_event_listener(lambda event, **kw: cache.update({event: cache[event] + 1})
                                           if event in cache else None)
    x = np.random.default_rng(0).standard_normal((4, 16, 2, 8)).astype(np.float32)
    w = np.eye(8, dtype=np.float32) * 0.5
    sharding = NamedSharding(jax.make_mesh((2,), ("data",)), PartitionSpec("data"))
    x, w = jax.device_put(x, sharding), jax.device_put(w, NamedSharding(sharding.mesh, PartitionSpec()))

    def f(x, w):
        q = matmul(x.reshape(-1, 8), w, jnp.float32).reshape(x.shape)
        return fused_attention(q, x, x, causal=sys.argv[2] == "causal")

    out = jax.jit(f)(x, w)
    print(json.dumps({"hits": cache["/jax/compilation_cache/cache_hits"],
                      "misses": cache["/jax/compilation_cache/cache_misses"], "out": np.asarray(out).tolist()}))
"""


@pytest.fixture(scope="module")
def kernels():
    assert fused_attention.fused_available(), fused_attention.unavailable_reason()
    assert onednn_matmul.onednn_available(), onednn_matmul.unavailable_reason()


def _run(cache, mask: str) -> dict:
    done = run_python(SCRIPT.replace("sys.argv[1]", repr(str(cache))).replace("sys.argv[2]", repr(mask)),
                      {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2",
                       "JAX_PLATFORMS": "cpu"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_is_served_the_partitioned_program_and_another_mask_is_compiled(tmp_path, kernels):
    first, again, unmasked = _run(tmp_path, "causal"), _run(tmp_path, "causal"), _run(tmp_path, "none")
    assert (first["hits"], again["misses"]) == (0, 0) and first["misses"] == again["hits"] >= 1
    assert again["out"] == first["out"]
    assert unmasked["misses"] == 1  # the same shapes and shardings, another static argument: its own program
    x = np.random.default_rng(0).standard_normal((4, 16, 2, 8)).astype(np.float32)
    scores = np.einsum("bthd,bshd->bhts", 0.5 * x, x) / np.sqrt(8)
    for result, causal in ((first, True), (unmasked, False)):
        masked = np.where(np.tril(np.ones((16, 16), bool)), scores, -np.inf) if causal else scores
        weights = np.exp(masked - masked.max(-1, keepdims=True))
        expected = np.einsum("bhts,bshd->bthd", weights / weights.sum(-1, keepdims=True), x)
        np.testing.assert_allclose(result["out"], expected, rtol=1e-5, atol=1e-6)
