"""Session 48: one reduction alone under each YNNPACK fusion setting (see results.txt)."""
import time, jax, jax.numpy as jnp
B, T, D = 16, 256, 256
k = jax.random.split(jax.random.key(0), 3)
a = jax.random.normal(k[0], (B, T, D)); b = jax.random.normal(k[1], (B, T, D))
def col3(a, b): return jnp.sum(a * b, axis=(0, 1))
def row3(a, b): return jnp.sum(a * b, axis=-1)
def col3_dot(a, b): return jnp.einsum('btd,btd->d', a, b)
def col3_bt(a,b):
    x = (a*b).reshape(B*T, D)
    return jnp.sum(x.reshape(-1, 32, D), axis=1).sum(0)
for f in (col3, row3, col3_dot, col3_bt):
    g = jax.jit(f); r = g(a, b).block_until_ready()
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(50): r = g(a, b)
        r.block_until_ready(); ts.append((time.perf_counter() - t) / 50)
    print(f"{f.__name__:12s} {min(ts)*1e6:8.1f} us")
    if f is col3: print([l for l in g.lower(a,b).compile().as_text().split('\n') if 'reduce-window(' in l or 'outer_dim' in l][:3])
