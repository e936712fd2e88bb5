"""A/B of two fused-attention libraries in one process: each registered under its own FFI target names,
forward and backward calls timed in alternation (medians), outputs compared bit for bit.

XLA_FLAGS=--xla_force_host_platform_device_count=1 taskset -c 0 python attention_call_ab.py A.so,B.so 16x128x4x32 ..."""
import ctypes, sys, time, statistics
import jax, jax.numpy as jnp, numpy as np
libs = sys.argv[1].split(",")
shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[2:]]
calls = {}
for i, path in enumerate(libs):
    lib = ctypes.cdll.LoadLibrary(path)
    for kind, sym in (("fwd", "JaxformerAttentionForward"), ("bwd", "JaxformerAttentionBackward")):
        jax.ffi.register_ffi_target(f"ab{i}_{kind}", jax.ffi.pycapsule(getattr(lib, sym)), platform="cpu")
def attrs(D): return dict(scale=np.float32(D**-0.5), causal=np.int64(1), q_offset=np.int64(0))
for (B,T,H,D) in shapes:
    key = jax.random.PRNGKey(0)
    q,k,v,g = (jax.random.normal(jax.random.fold_in(key,i),(B,T,H,D),jnp.float32) for i in range(4))
    fns = []
    for i in range(len(libs)):
        f = jax.jit(lambda q,k,v,i=i: tuple(jax.ffi.ffi_call(f"ab{i}_fwd",(jax.ShapeDtypeStruct(q.shape,jnp.float32),jax.ShapeDtypeStruct((B,H,T),jnp.float32)))(q,k,v,**attrs(D))))
        out, lse = f(q,k,v)
        b = jax.jit(lambda q,k,v,o,g,l,i=i: tuple(jax.ffi.ffi_call(f"ab{i}_bwd",tuple(jax.ShapeDtypeStruct(x.shape,jnp.float32) for x in (q,k,v)))(q,k,v,o,g,l,**attrs(D))))
        grads = b(q,k,v,out,g,lse)
        fns.append((f, b, out, lse, grads))
    for i in range(1, len(libs)):
        same = all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip((fns[0][2], fns[0][3]) + fns[0][4], (fns[i][2], fns[i][3]) + fns[i][4]))
        err = max(float(jnp.max(jnp.abs(x-y))) for x, y in zip((fns[0][2],) + fns[0][4], (fns[i][2],) + fns[i][4]))
        print(f"{B}x{T}x{H}x{D} lib{i} vs lib0: bitwise {same}, max abs diff {err:.2e}")
    times = [[[], []] for _ in libs]
    for rep in range(21):
        for i, (f, b, out, lse, _) in enumerate(fns):
            t = time.perf_counter(); jax.block_until_ready(f(q,k,v)); times[i][0].append(time.perf_counter()-t)
            t = time.perf_counter(); jax.block_until_ready(b(q,k,v,out,g,lse)); times[i][1].append(time.perf_counter()-t)
    half = B*H*T*(T+1)/2*D*2
    row = [f"{B}x{T}x{H}x{D}"]
    for i in range(len(libs)):
        mf, mb = statistics.median(times[i][0]), statistics.median(times[i][1])
        row.append(f"lib{i} fwd {mf*1e3:.2f} ms ({2*half/mf/1e9:.0f} GF/s) bwd {mb*1e3:.2f} ms ({5*half/mb/1e9:.0f} GF/s)")
    print(" | ".join(row))
