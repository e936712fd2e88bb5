import sys, statistics
from jaxformer.train.config import config_from_dict
from jaxformer.train.throughput import TrainStepRunner
out = []
for size in sys.argv[1].split(","):
    d, L = map(int, size.split(":"))
    cfg = config_from_dict({"model": {"preset": "tiny", "d_model": d, "num_layers": L, "num_heads": max(1, d // 8), "max_seq_len": 256},
        "train": {"batch_size": 16, "seq_len": 128, "tokens": 16 * 128 * 1000}, "kernel": {"attention_impl": "fused", "matmul_impl": "onednn"}})
    r = TrainStepRunner(cfg); r.run(3)
    t = [r.run(20) / 20 for _ in range(5)]
    out.append(f"{size}={statistics.median(t)*1e3:.3f}")
print(" ".join(out))
