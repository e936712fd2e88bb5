"""The loss alone: value and gradient of F.cross_entropy against optax's on one step's logits ([2048, 256], fp32),
and the row maximum alone, alternating, 30 x 20 calls each, medians.
XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1 --xla_force_host_platform_device_count=1" taskset -c 0 python loss_call.py"""
import statistics, time
import jax, jax.numpy as jnp, optax
import jaxformer.functional as F
from jaxformer.functional.cross_entropy import row_max
N, V = 2048, 256
key = jax.random.PRNGKey(0)
logits = 3 * jax.random.normal(key, (N, V), jnp.float32)
labels = jax.random.randint(jax.random.fold_in(key, 1), (N,), 0, V)
fns = {"optax value+grad": jax.jit(jax.value_and_grad(lambda x: optax.softmax_cross_entropy_with_integer_labels(x, labels).mean())),
       "F.cross_entropy value+grad": jax.jit(jax.value_and_grad(lambda x: F.cross_entropy(x, labels).mean())),
       "jnp.max": jax.jit(lambda x: jnp.max(x, -1)), "row_max": jax.jit(row_max)}
times = {k: [] for k in fns}
for _ in range(30):
    for k, f in fns.items():
        jax.block_until_ready(f(logits))
        start = time.perf_counter()
        for _ in range(20):
            r = f(logits)
        jax.block_until_ready(r)
        times[k].append((time.perf_counter() - start) / 20)
for k, v in times.items():
    print(f"{k:<28}{statistics.median(v) * 1e6:8.0f} us")
