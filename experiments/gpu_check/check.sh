#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool's `run`): the machine; a sweep with a fit stage (the launcher fits on
# the CPU while the warm worker holds the GPU); the train run of gpu.yaml's architecture that outlasted 95 s of
# compilation in session 26, first with XLA's GPU autotuning off, then with it on, each program's compile time
# logged; the device-agnostic tests on the GPU. Logs go to $OUT. Every step is bounded so that the whole call ends
# within DEADLINE seconds.
# Run from the repository root with the wheels of the packages the machine lacks in .whl/ (tensorboardX, gguf).
set -u
OUT=${OUT:-/tmp/gpu_check}
DEADLINE=${DEADLINE:-560}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; lscpu | grep -E 'Model name';
  python3 -c "import jax, flax, optax, orbax.checkpoint, ml_dtypes; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'ml_dtypes', ml_dtypes.__version__); print(jax.devices())"; } 2>&1 | tee "$OUT/machine.txt"
step() {  # name, seconds (cut to what the deadline leaves), command...
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - SECONDS))
  (( left < limit )) && limit=$left
  (( limit < 20 )) && { echo "=== $name skipped: $left s left"; return; }
  echo "=== $name ($(date -u +%T), limit $limit s)"
  local start=$SECONDS
  # SIGABRT first, so that a Python still compiling dumps its stacks (faulthandler), then SIGKILL
  PYTHONFAULTHANDLER=1 timeout -s ABRT -k 5 "$limit" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "rc $rc, $((SECONDS - start)) s" | tee -a "$OUT/$name.txt"
  grep -E 'Finished XLA compilation|layout|runs? (trained|done)|Approach|rc ' "$OUT/$name.txt" | tail -n 12
  tail -n 6 "$OUT/$name.txt"
}
step sweep_fit 90 python3 -m jaxformer.cli sweep experiments/gpu_check/tiny_fit.yaml --out /tmp/tiny_fit
nvidia-smi --query-gpu=memory.used --format=csv,noheader
TRAIN=(python3 -m jaxformer.cli train experiments/gpu_check/train_gpu.yaml train.tokens=6553600 logging.interval=10)
step train_bf16_no_autotune 120 env JAX_LOG_COMPILES=1 XLA_FLAGS=--xla_gpu_autotune_level=0 "${TRAIN[@]}" \
  --run-dir /tmp/train_gpu_no_autotune
cp /tmp/train_gpu_no_autotune/final.json "$OUT/train_no_autotune_final.json" 2>/dev/null
step tests 180 env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -n 8 -p no:cacheprovider \
  tests/test_functional_peers.py tests/test_functional_seeds.py tests/test_blockwise.py tests/test_nn_attention.py \
  tests/test_nn_moe.py tests/test_models_families.py tests/test_models_params.py tests/test_generate.py \
  tests/test_train_step.py tests/test_schedules.py tests/test_accounting.py tests/test_kernel_choice.py \
  tests/test_train_together.py tests/test_sweep_accelerators.py
step train_bf16 150 env JAX_LOG_COMPILES=1 "${TRAIN[@]}" --run-dir /tmp/train_gpu
cp /tmp/train_gpu/final.json "$OUT/train_final.json" 2>/dev/null
echo "total $SECONDS s"
