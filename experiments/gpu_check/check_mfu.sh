#!/usr/bin/env bash
# Second call of session 36 on a lent GPU machine: the matmul peak MFU is measured against (the probe now grows n on an
# accelerator), then gpu.yaml's train run twice: with empty caches, then again with the persistent compilation cache
# and the kernel choice the first left (a relaunch). Logs go to $OUT. Needs .whl/ as check.sh.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 - <<'PY' 2>&1 | tee "$OUT/peak.txt"
import time, jax
from jaxformer.train.peak import probe_matmul_peak
print(jax.devices())
for dtype in ("bfloat16", "float32"):
    for n, min_seconds in ((1024, 0.0), (1024, None)):
        start = time.perf_counter()
        flops = probe_matmul_peak(dtype, n=n, min_seconds=min_seconds)
        print(f"{dtype} min_seconds={min_seconds}: {flops / 1e12:.1f} TFLOP/s ({time.perf_counter() - start:.1f} s)")
PY
for name in train_cold train_warm; do
  echo "=== $name ($(date -u +%T))"
  start=$SECONDS
  timeout -k 5 130 python3 -m jaxformer.cli train experiments/gpu_check/train_gpu.yaml train.tokens=6553600 \
    logging.interval=10 --run-dir /tmp/$name > "$OUT/$name.txt" 2>&1
  echo "rc $?, $((SECONDS - start)) s" | tee -a "$OUT/$name.txt"
  grep -E '^step|^done' "$OUT/$name.txt" | tail -n 4
  cp /tmp/$name/final.json "$OUT/${name}_final.json" 2>/dev/null
  python3 -c "import json,sys; d=json.load(open('/tmp/$name/final.json')); print('mfu', d['mfu'], 'peak', d['peak_flops'], d['time'])"
done
