"""The bench pairing at d = 128 (batch 32, fused attention, oneDNN matmuls, two devices): the JAX step alone, then
alternating with PyTorch's: each side's first 5 steps after the other's, the next 5, and (third) 5 steps after one
untimed step. Run with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type=
--xla_force_host_platform_device_count=2"."""
import statistics
import jax
from jaxformer.benchmarks.train import bench_config, timed_torch_step
from jaxformer.train.throughput import TrainStepRunner
cfg = bench_config(128, 4, 128, 32, attention_impl="fused", matmul_impl="onednn")
r = TrainStepRunner(cfg)
tok = 5 * r.tokens_per_step
alone = [tok / r.run(5) for _ in range(4)]
import torch
torch.set_num_threads(2)
ts = timed_torch_step(cfg); ts(steps=1)
first, second, third, tfirst, tsecond = [], [], [], [], []
for _ in range(8):
    tfirst.append(tok / ts(steps=5)); tsecond.append(tok / ts(steps=5))
    first.append(tok / r.run(5)); second.append(tok / r.run(5))
    ts(steps=5); r.run(1); third.append(tok / r.run(5))
f = lambda xs: f"median {statistics.median(xs):,.0f} [{min(xs):,.0f}, {max(xs):,.0f}]"
print("jax alone:", f(alone))
print("jax, first 5 steps after torch:", f(first))
print("jax, the next 5 steps:", f(second))
print("torch, first 5 steps after jax:", f(tfirst))
print("torch, the next 5 steps:", f(tsecond))
print("jax, 5 steps after torch and one untimed step:", f(third))
