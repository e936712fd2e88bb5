"""Session 48 A/B: the bench's train step compiled with YNNPACK fusions off against reduce-only, in one process,
alternating repeats (results.txt). Usage, in the tuned environment (GLIBC_TUNABLES as `jaxformer` sets them,
XLA_FLAGS=--xla_force_host_platform_device_count=2):  python step_ab.py D LAYERS SEQ BATCH reduce STEPS REPEATS"""
import statistics
import sys

import jaxformer.runtime as rt
import jaxformer.train.throughput as tp
from jaxformer.benchmarks.train import bench_config

d, L, T, batch = map(int, sys.argv[1:5])
kind = sys.argv[5] if len(sys.argv) > 5 else "reduce"
steps = int(sys.argv[6]) if len(sys.argv) > 6 else 5
repeats = int(sys.argv[7]) if len(sys.argv) > 7 else 6


def with_fusion_type(value):
    """compile_program with ``xla_cpu_experimental_ynn_fusion_type`` set to ``value`` ("" = off)."""
    def compile_program(lowered, *, loop_free=False):
        options = rt.scratch_compiler_options(lowered, "cpu")
        options["xla_cpu_experimental_ynn_fusion_type"] = f"LIBRARY_FUSION_TYPE_{value.upper()}" if value else ""
        return lowered.compile(options)
    return compile_program


runners = {}
for name, value in (("off", ""), (kind, kind)):
    tp.compile_program = with_fusion_type(value)
    runners[name] = tp.TrainStepRunner(bench_config(d, L, T, batch, "float32", "fused", "onednn"))
times = {name: [] for name in runners}
for _ in range(repeats):
    for name, runner in runners.items():
        runner.run(1)
        times[name].append(runner.run(steps) / steps)
for name, values in times.items():
    print(f"{name:8s} median {statistics.median(values) * 1e3:8.2f} ms  min {min(values) * 1e3:8.2f}  "
          f"all {[round(x * 1e3, 1) for x in values]}")
print(f"speedup {statistics.median(times['off']) / statistics.median(times[kind]):.3f}")
for name, runner in runners.items():
    text = runner.step.as_text()
    print(name, "YNNPACK fusions", text.count("__ynn_fusion"), "reduce-windows", text.count("reduce-window("))
