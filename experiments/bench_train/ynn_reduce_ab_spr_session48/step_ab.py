"""Session 48 A/B: the bench train step with YNNPACK fusions off against reduce-only fusions, one process (see results.txt)."""
"""A/B in one process: train step compiled with YNN fusions '' vs 'reduce' (alternating repeats)."""
import sys, statistics, jax
import jaxformer.runtime as rt
import jaxformer.train.throughput as tp
from jaxformer.benchmarks.train import bench_config
d, L, T, batch = map(int, sys.argv[1:5]); kind = sys.argv[5] if len(sys.argv) > 5 else "reduce"
orig = rt.compile_program
def with_type(value):
    def compile_program(lowered, *, loop_free=False):
        opts = rt.scratch_compiler_options(lowered, "cpu"); opts["xla_cpu_experimental_ynn_fusion_type"] = ("LIBRARY_FUSION_TYPE_" + value.upper()) if value else ""
        return lowered.compile(opts)
    return compile_program
runners = {}
for name, value in (("off", ""), (kind, kind)):
    tp.compile_program = with_type(value)
    runners[name] = tp.TrainStepRunner(bench_config(d, L, T, batch, "float32", "fused", "onednn"))
steps = int(sys.argv[6]) if len(sys.argv) > 6 else 5
times = {k: [] for k in runners}
for rep in range(int(sys.argv[7]) if len(sys.argv) > 7 else 6):
    for k, r in runners.items():
        r.run(1); times[k].append(r.run(steps) / steps)
for k, v in times.items():
    print(f"{k:8s} median {statistics.median(v)*1e3:8.2f} ms  min {min(v)*1e3:8.2f}  all {[round(x*1e3,1) for x in v]}")
a, b = statistics.median(times["off"]), statistics.median(times[kind]); print(f"speedup {a/b:.3f}")
for k, r in runners.items():
    h = r.step.as_text(); print(k, "ynn_fusion count", h.count("__ynn_fusion"), "reduce-window", h.count("reduce-window("))
