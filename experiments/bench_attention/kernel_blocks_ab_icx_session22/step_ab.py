"""Train steps with two fused-attention libraries in one process, alternating repeats (medians).

JAXFORMER_FUSED_ATTENTION_LIB=A.so XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type= \
  --xla_force_host_platform_device_count=2" python step_ab.py B.so 128:4:128,256:4:256 15
B's targets are registered under other names and patched in while its step compiles. Optional 4th and 5th
arguments: batch and head dim (default 32 and 32)."""
import ctypes, dataclasses, statistics, sys
import jax
from jaxformer.functional import fused_attention as fa
assert fa.fused_available(), fa.unavailable_reason()
lib_b = ctypes.cdll.LoadLibrary(sys.argv[1])
for target, sym in (("ab_fwd", "JaxformerAttentionForward"), ("ab_bwd", "JaxformerAttentionBackward")):
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib_b, sym)), platform="cpu")
    jax.ffi.register_ffi_target_as_batch_partitionable(target)
from jaxformer.benchmarks.train import bench_config, parse_sizes
from jaxformer.train.throughput import TrainStepRunner
STEPS = 5
print("A:", fa.loaded_path(), "B:", sys.argv[1])
batch, head_dim = (int(x) for x in (sys.argv[4:6] if len(sys.argv) > 5 else (32, 32)))
for d, L, T in parse_sizes(sys.argv[2]):
    cfg = bench_config(d, L, T, batch, attention_impl="fused", matmul_impl="onednn")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_heads=max(1, d // head_dim)))
    fa.FORWARD_TARGET, fa.BACKWARD_TARGET = "jaxformer_fused_attention_fwd", "jaxformer_fused_attention_bwd"
    a = TrainStepRunner(cfg)
    fa.FORWARD_TARGET, fa.BACKWARD_TARGET = "ab_fwd", "ab_bwd"
    b = TrainStepRunner(cfg)
    ta, tb = [], []
    for rep in range(int(sys.argv[3])):
        ta.append(a.run(STEPS)); tb.append(b.run(STEPS))
    ma, mb = statistics.median(ta), statistics.median(tb)
    ratios = sorted(x / y for x, y in zip(ta, tb))
    print(f"d={d} L={L} T={T}: A {STEPS*a.tokens_per_step/ma:,.0f} tok/s, B {STEPS*b.tokens_per_step/mb:,.0f} tok/s, "
          f"A/B time {ma/mb:.3f}, per-pair ratios {[round(r,3) for r in ratios]}")
