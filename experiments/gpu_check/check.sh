#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool's `run`): the machine, a sweep with the default layout, a train run
# of gpu.yaml's architecture, and the device-agnostic tests on the GPU. Logs go to $OUT.
# Run from the repository root with the wheels of the packages the machine lacks in .whl/ (tensorboardX, gguf).
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; lscpu | grep -E 'Model name';
  python3 -c "import jax, flax, optax, orbax.checkpoint, ml_dtypes, torch; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'ml_dtypes', ml_dtypes.__version__, 'torch', torch.__version__); print(jax.devices())"; } 2>&1 | tee "$OUT/machine.txt"
step() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date -u +%T))"
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "rc $rc, $((SECONDS - start)) s" | tee -a "$OUT/$name.txt"
  tail -n 25 "$OUT/$name.txt"
}
step sweep_default 120 python3 -m jaxformer.cli sweep sweeps/tiny.yaml --out /tmp/tiny_default
nvidia-smi --query-gpu=memory.used --format=csv
# the train run, its Python stacks dumped if it is still running at the limit
step train_bf16 100 env PYTHONFAULTHANDLER=1 timeout -s ABRT 95 python3 -m jaxformer.cli train \
  experiments/gpu_check/train_gpu.yaml train.tokens=6553600 logging.interval=10 --run-dir /tmp/train_gpu
cp /tmp/train_gpu/final.json "$OUT/train_final.json" 2>/dev/null
# the same with XLA's GPU autotuning off: does the compile that outlasted 95 s (session 26) come from autotuning?
step train_bf16_no_autotune 100 env PYTHONFAULTHANDLER=1 XLA_FLAGS=--xla_gpu_autotune_level=0 timeout -s ABRT 95 \
  python3 -m jaxformer.cli train experiments/gpu_check/train_gpu.yaml train.tokens=6553600 logging.interval=10 \
  --run-dir /tmp/train_gpu_no_autotune
step tests 170 env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -n 8 -p no:cacheprovider \
  tests/test_functional_peers.py tests/test_functional_seeds.py tests/test_blockwise.py tests/test_nn_attention.py \
  tests/test_nn_moe.py tests/test_models_families.py tests/test_models_params.py tests/test_generate.py \
  tests/test_train_step.py tests/test_schedules.py tests/test_accounting.py tests/test_kernel_choice.py \
  tests/test_train_together.py tests/test_sweep_accelerators.py
