"""Session 48: one sum of a product alone under each YNNPACK fusion setting (results.txt). Usage:
XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type=<T> --xla_cpu_multi_thread_eigen=false" python reduction_alone.py"""
import time

import jax
import jax.numpy as jnp

B, T, D = 16, 256, 256
key_a, key_b = jax.random.split(jax.random.key(0))
a, b = jax.random.normal(key_a, (B, T, D)), jax.random.normal(key_b, (B, T, D))
variants = {"over (B, T)": lambda a, b: jnp.sum(a * b, axis=(0, 1)),
            "over the last axis": lambda a, b: jnp.sum(a * b, axis=-1)}
for name, function in variants.items():
    compiled = jax.jit(function)
    compiled(a, b).block_until_ready()
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(50):
            result = compiled(a, b)
        result.block_until_ready()
        best = min(best, (time.perf_counter() - start) / 50)
    print(f"{name:20s} {best * 1e6:8.1f} us")
