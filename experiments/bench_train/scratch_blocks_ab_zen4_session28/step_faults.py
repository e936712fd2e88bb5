import resource, sys, time, os
d, L, T, inline = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "inline"
if inline:
    from jaxformer.runtime import run_inline_on_cpu; run_inline_on_cpu()
from jaxformer.benchmarks.train import bench_config
from jaxformer.train.matmul_choice import choose_kernels
from jaxformer.train.throughput import TrainStepRunner
config, choice, mm = choose_kernels(bench_config(d, L, T, 32, attention_impl="auto", matmul_impl="auto"))
r = TrainStepRunner(config)
r.run(3)
out = []
for _ in range(3):
    ru0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
    r.run(5)
    t = (time.perf_counter() - t0) / 5; ru1 = resource.getrusage(resource.RUSAGE_SELF)
    out.append((t * 1e3, (ru1.ru_minflt - ru0.ru_minflt) / 5, (ru1.ru_stime - ru0.ru_stime) / 5 * 1e3))
print(os.environ.get("XLA_FLAGS"), "inline" if inline else "async", r.devices, choice.attention_impl, mm.matmul_impl)
for o in out: print("step %.1f ms  faults %.0f  sys %.1f ms" % o)
