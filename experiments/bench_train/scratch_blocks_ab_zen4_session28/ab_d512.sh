# Run at cfecb1e (before `compile_program`), 2026-12-04 23:11 UTC, lscpu "AMD EPYC" family 25 model 17 (Zen 4), 2 cores:
# "before" is the tuned environment of then, "after" adds the top_pad tunable and the multiheap limit as an XLA flag
# (since `compile_program` the limit is a per-program compiler option, so both sides would now get it).
T=glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296
B="--xla_cpu_experimental_ynn_fusion_type= --xla_force_host_platform_device_count=2"
for i in 1 2; do
GLIBC_TUNABLES=$T XLA_FLAGS="$B" .venv/bin/python experiments/bench_train/scratch_blocks_ab_zen4_session28/step_faults.py 512 8 256 async 2>&1 | grep -v "^W1204"
GLIBC_TUNABLES=$T:glibc.malloc.top_pad=134217728 XLA_FLAGS="$B --xla_multiheap_size_constraint_per_heap=50331648" .venv/bin/python experiments/bench_train/scratch_blocks_ab_zen4_session28/step_faults.py 512 8 256 async 2>&1 | grep -v "^W1204"
done
