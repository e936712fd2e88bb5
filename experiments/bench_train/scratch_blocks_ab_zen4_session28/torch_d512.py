import os, time, resource
from jaxformer.benchmarks.train import bench_config, timed_torch_step
step = timed_torch_step(bench_config(512, 8, 256, 32))
step(steps=1)
ts = []
for _ in range(2):
    ru0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter(); step(steps=2); ts.append((time.perf_counter() - t) / 2)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
print(os.environ["GLIBC_TUNABLES"][-20:], ["%.2f s" % x for x in ts], "faults/step", (ru1.ru_minflt - ru0.ru_minflt) / 2, "sys s/step %.2f" % ((ru1.ru_stime - ru0.ru_stime) / 2))
