"""Attention-alone ratio (what auto times now) against the whole train step's ratio (what it timed before)."""
import json, statistics, sys, time
from jaxformer.train.config import load_config
from jaxformer.train import kernel_choice as kc
from jaxformer.train.throughput import TrainStepRunner

def step_ratio(config, steps=5, repeats=5):
    runners = {i: TrainStepRunner(kc.with_impl(config, i)) for i in ("naive", "fused")}
    t = {i: [] for i in runners}
    for _ in range(repeats):
        for i, r in runners.items():
            t[i].append(r.run(steps) / steps)
    return {i: statistics.median(v) for i, v in t.items()}

rows = []
for spec in sys.argv[1:]:
    d, L, T, B, hd = map(int, spec.split(":"))
    cfg = load_config(None, [f"model.d_model={d}", f"model.num_layers={L}", f"model.num_heads={d // hd}",
                             f"model.max_seq_len={T}", f"train.seq_len={T}", f"train.batch_size={B}",
                             "data.corpus=synthetic-markov"])
    t0 = time.perf_counter(); a = kc.measure(cfg, ["naive", "fused"]); ta = time.perf_counter() - t0
    t0 = time.perf_counter(); s = step_ratio(cfg); ts = time.perf_counter() - t0
    row = dict(size=spec, attn_naive_ms=a["naive"]*1e3, attn_fused_ms=a["fused"]*1e3,
               attn_speedup=a["naive"]/a["fused"], attn_timing_s=ta, step_naive_ms=s["naive"]*1e3,
               step_fused_ms=s["fused"]*1e3, step_speedup=s["naive"]/s["fused"],
               saved_per_step_ms=(s["naive"]-s["fused"])*1e3, saved_attn_x_layers_ms=(a["naive"]-a["fused"])*L*1e3,
               step_timing_s=ts, attn_choice=kc.fastest(a), step_choice=kc.fastest(s))
    rows.append(row); print(json.dumps(row), flush=True)
