"""The CPU speed work changes no numbers, compiles once per shape, and runs in the tuned process environment."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer.functional as F
from jaxformer.runtime import (HOST_DEVICES, HUGE_PAGES, MALLOC_TUNABLES, NO_YNN_FUSION, SCRATCH_BLOCK_BYTES,
                               largest_array_bytes, scratch_compiler_options, tuned_environment, usable_cores)
from jaxformer.sweep.executors import thread_environment
from jaxformer.train.config import load_config
from jaxformer.train.optimizer import make_optimizer
from jaxformer.train.step import build_state, make_train_step
from jaxformer.train.throughput import random_windows


def _losses(config, steps: int) -> list[float]:
    """Per-step train losses of ``steps`` AdamW updates, all on the same random windows (memorised)."""
    optimizer = make_optimizer(config.optimizer)
    graphdef, state = build_state(config.model, 0, optimizer)
    step = make_train_step(graphdef, optimizer, "float32")
    windows = jnp.asarray(random_windows(config))
    losses, total = [], 0.0
    for _ in range(steps):
        state = step(state, windows, np.float32(config.optimizer.lr))
        new_total = float(state["sums"]["loss"])
        losses.append(new_total - total)
        total = new_total
    return losses


def test_fast_attention_path_leaves_a_few_steps_losses_unchanged():
    """Causal query blocks (the default) against the plain single-block pass, 4 AdamW steps."""
    config = load_config(None, ["model.d_model=32", "model.num_layers=2", "model.num_heads=2", "model.max_seq_len=128",
                                "train.seq_len=128", "train.batch_size=2", "optimizer.lr=1e-2"])
    assert config.kernel.attention_query_block_size < config.train.seq_len
    plain = dataclasses.replace(config, kernel=dataclasses.replace(config.kernel, attention_query_block_size=None))
    fast_losses, plain_losses = _losses(config, 4), _losses(plain, 4)
    assert plain_losses[-1] < plain_losses[0] - 0.05  # the steps do train
    np.testing.assert_allclose(fast_losses, plain_losses, rtol=2e-6)


@pytest.mark.parametrize(("x_shape", "w_shape", "in_axes", "spec"), [
    ((2, 5, 8), (8, 3, 4), 1, "bte,ehd->bthd"),   # query projection
    ((2, 5, 3, 4), (3, 4, 8), 2, "bthd,hde->bte"),  # attention output
    ((5, 8), (8, 6), 1, "ne,ef->nf"),
])
def test_dense_equals_the_einsum_in_value_and_gradient(x_shape, w_shape, in_axes, spec):
    kx, kw = jax.random.split(jax.random.key(0))
    x, w = jax.random.normal(kx, x_shape), jax.random.normal(kw, w_shape)
    np.testing.assert_allclose(F.dense(x, w, in_axes=in_axes), jnp.einsum(spec, x, w), rtol=1e-6, atol=1e-6)
    loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))  # noqa: E731
    ours = jax.grad(loss(lambda x, w: F.dense(x, w, in_axes=in_axes)), argnums=(0, 1))(x, w)
    peer = jax.grad(loss(lambda x, w: jnp.einsum(spec, x, w)), argnums=(0, 1))(x, w)
    for a, b in zip(ours, peer):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)  # fp32, another summation order
    with pytest.raises(ValueError, match=r"dense: x's last 1 axes \(7,\) must equal w's first \(8,\)"):
        F.dense(jnp.ones((2, 7)), jnp.ones((8, 3)))


def _train(tmp_path, name: str, cache: str) -> subprocess.CompletedProcess:
    (tmp_path / "empty.yaml").write_text("{}\n")
    command = [sys.executable, "-m", "jaxformer.cli", "train", str(tmp_path / "empty.yaml"), "model.d_model=16", "model.num_layers=1",
               "model.num_heads=2", "model.max_seq_len=16", "train.seq_len=16", "train.batch_size=2",
               "train.tokens=128", "train.eval_tokens=32", "train.peak_flops=1e12", "data.corpus=synthetic-markov",
               "data.markov.bytes=20000", f"train.compilation_cache={cache}", "logging.progress=plain",
               "logging.tensorboard=false", "--run-dir", str(tmp_path / name)]
    env = {**os.environ, "JAX_LOG_COMPILES": "1", "JAX_PLATFORMS": "cpu"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=True)


@pytest.mark.slow
def test_position_tables_are_constants_for_concrete_positions_and_traced_otherwise():
    """Under jit, concrete positions (RoPE, sinusoids) leave no sin/cos in the program; a traced offset does."""
    x = jax.random.normal(jax.random.key(0), (2, 6, 3, 8))
    eager = F.apply_rope(x, jnp.arange(6) + 3)
    concrete = lambda x: F.apply_rope(x, np.arange(6) + 3)  # noqa: E731
    traced = lambda x, offset: F.apply_rope(x, offset + jnp.arange(6))  # noqa: E731
    np.testing.assert_allclose(jax.jit(concrete)(x), eager, rtol=0, atol=1e-6)
    np.testing.assert_allclose(jax.jit(traced)(x, 3), eager, rtol=0, atol=1e-6)
    primitives = lambda jaxpr: {eqn.primitive.name for eqn in jaxpr.eqns}  # noqa: E731
    assert not {"sin", "cos"} & primitives(jax.make_jaxpr(concrete)(x))
    assert {"sin", "cos"} <= primitives(jax.make_jaxpr(traced)(x, 3))
    assert not {"sin", "cos"} & primitives(jax.make_jaxpr(lambda: F.sinusoidal_positions(6, 8))())


def test_second_identical_run_hits_the_compilation_cache(tmp_path):
    cache = str(tmp_path / "xla")
    first, second = _train(tmp_path, "first", cache), _train(tmp_path, "second", cache)
    hit = "Persistent compilation cache hit for 'jit_train_step'"
    assert hit not in first.stderr and hit in second.stderr
    assert "cache hit for 'jit_eval_pass'" in second.stderr
    first, second = (json.loads((tmp_path / n / "final.json").read_text()) for n in ("first", "second"))
    assert second["compile_s"] < first["compile_s"]
    # the command made each core a device and trained data-parallel over those that split the batch of 2
    assert first["mesh"] == {"data": min(2, usable_cores()), "fsdp": 1, "tensor": 1, "expert": 1}


def test_tuned_environment_adds_its_settings_once_and_keeps_the_users():
    devices = f"{HOST_DEVICES}={usable_cores()}"
    malloc = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
              ":glibc.malloc.top_pad=134217728")
    fusions_off = f"{NO_YNN_FUSION} " if usable_cores() == 1 else ""  # one device only (test_runtime_mesh_loop)
    assert tuned_environment({}) == {"GLIBC_TUNABLES": malloc, "XLA_FLAGS": f"{fusions_off}{devices}"}
    tuned = tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "XLA_FLAGS": "--xla_foo=1"})
    assert tuned["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{malloc}"
    assert tuned["XLA_FLAGS"] == f"{fusions_off}--xla_foo=1 {devices}"
    assert tuned_environment(tuned) == tuned
    mine = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0:glibc.malloc.mmap_max=9:glibc.malloc.trim_threshold=1"
                              ":glibc.malloc.top_pad=0",
            "XLA_FLAGS": f"--xla_cpu_experimental_ynn_fusion_type=dot {HOST_DEVICES}=1"}
    assert tuned_environment(mine) == mine
    assert tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})["GLIBC_TUNABLES"] == \
        "glibc.malloc.hugetlb=0:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296:glibc.malloc.top_pad=134217728"
    assert tuned_environment({"JAXFORMER_TUNE": "0"}) == {"JAXFORMER_TUNE": "0"}


_FAULTS_PER_CALL = """
import resource, sys, jax, jax.numpy as jnp
from jaxformer.runtime import run_inline_on_cpu
columns, inline = int(sys.argv[1]), sys.argv[2] == "inline"
if inline:
    run_inline_on_cpu()
# the [4096, columns] fp32 activation between the two products is the program's scratch
f = jax.jit(lambda x, w: (jnp.tanh(x @ w) @ w.T).sum())
x, w = jnp.ones((4096, 64)), jnp.full((64, columns), 0.01)
for _ in range(10):  # calls may run on several threads, each allocating from its own malloc arena first
    f(x, w).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    f(x, w).block_until_ready()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def _printed_numbers(program: str, args: list[str], tunables: str) -> list[float]:
    """The numbers ``program`` prints last, run with ``args`` in a one-device process with these glibc tunables."""
    env = {**os.environ, "GLIBC_TUNABLES": tunables, "XLA_FLAGS": f"{HOST_DEVICES}=1"}
    run = subprocess.run([sys.executable, "-c", program, *args], env=env, check=True, capture_output=True, text=True,
                         timeout=120)
    return [float(word) for word in run.stdout.splitlines()[-1].split()]


def _faults_per_call(tunables: str, columns: int, dispatch: str) -> float:
    """Minor page faults per call of a one-device program with ``4096 × columns`` floats of scratch, in a process
    with these glibc tunables, its programs dispatched ``async`` (JAX's default) or ``inline``."""
    return _printed_numbers(_FAULTS_PER_CALL, [str(columns), dispatch], tunables)[-1]


def _fewest_faults_per_call(tunables: str, columns: int, dispatch: str, processes: int = 3) -> float:
    """The fewest of ``processes`` processes' faults per call: another process's load on the machine can add
    faults to one of them (38.9 a call, once, with both cores busy), not take them away."""
    return min(_faults_per_call(tunables, columns, dispatch) for _ in range(processes))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tunables are glibc's")
def test_the_tuned_malloc_reuses_large_scratch_memory_without_page_faults():
    """48 MiB of scratch is faulted in afresh at every call with huge pages alone (24 huge pages, or more where the
    kernel gives 4 KiB ones), and not at all with the tuned settings: the freed block is reused."""
    assert _faults_per_call(HUGE_PAGES, 3072, "async") >= 20
    assert _fewest_faults_per_call(":".join(MALLOC_TUNABLES), 3072, "async") < 5


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tunables are glibc's")
def test_sweep_workers_run_their_programs_inline_so_scratch_above_64_mib_is_reused():
    """96 MiB of scratch exceeds a thread arena's heaps: run on XLA's thread it is mapped afresh at every call even
    with the tuned settings; run inline, as sweep workers run theirs (`run_inline_on_cpu`), it is reused."""
    assert _faults_per_call(":".join(MALLOC_TUNABLES), 6144, "async") >= 20
    assert _fewest_faults_per_call(":".join(MALLOC_TUNABLES), 6144, "inline") < 5


_SPLIT_SCRATCH = """
import resource, sys, jax, jax.numpy as jnp
from jaxformer.runtime import compile_program
# two [4096, 3072] fp32 products (48 MiB each) live together (one is read backwards): 96 MiB of scratch
f = jax.jit(lambda x, w: jnp.maximum(x @ w, (x @ (2 * w))[::-1]).sum())
x, w = jnp.ones((4096, 64)), jnp.full((64, 3072), 0.01)
program = compile_program(f.lower(x, w)) if sys.argv[1] == "split" else f.lower(x, w).compile()
for _ in range(10):
    value = program(x, w).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    program(x, w).block_until_ready()
print(float(value), (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def _split_scratch_run(mode: str) -> tuple[float, float]:
    """(value, minor page faults per call) of a program with 96 MiB of scratch run on XLA's thread, in a process
    with the tuned malloc, compiled by `compile_program` (``split``) or plainly."""
    value, faults = _printed_numbers(_SPLIT_SCRATCH, [mode], ":".join(MALLOC_TUNABLES))
    return value, faults


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tunables are glibc's")
def test_scratch_split_into_blocks_a_thread_arena_holds_is_reused_without_page_faults():
    """96 MiB of scratch in one block is mapped afresh at every call on XLA's thread (its malloc arena's heaps hold
    64 MiB); `compile_program` splits it into blocks of at most 48 MiB, which the arena keeps. Same value."""
    plain_value, plain_faults = _split_scratch_run("plain")
    runs = []  # up to five tries, the fewest faults counted: another process (pytest's other worker) adds faults
    while len(runs) < 5 and not (runs and runs[-1][1] < 5):
        runs.append(_split_scratch_run("split"))
    assert plain_faults >= 20 and min(faults for _, faults in runs) < 5
    assert all(value == plain_value for value, _ in runs)


def test_scratch_blocks_are_asked_for_only_on_the_cpu_and_when_no_array_is_larger():
    assert largest_array_bytes("%0 = stablehlo.dot %a : (tensor<16x256xf32>, tensor<256x64xbf16>) -> tensor<i32>") \
        == 256 * 64 * 2
    assert largest_array_bytes("tensor<3x5xi1> tensor<2x2xf64> tensor<f32>") == 2 * 2 * 8
    small = jax.jit(lambda x: x @ x).lower(jax.ShapeDtypeStruct((1024, 1024), jnp.float32))
    assert scratch_compiler_options(small, "cpu") == {"xla_multiheap_size_constraint_per_heap": SCRATCH_BLOCK_BYTES}
    assert scratch_compiler_options(small, "gpu") == {}
    rows = SCRATCH_BLOCK_BYTES // (4 * 1024) + 1  # one array a row larger than a block
    large = jax.jit(lambda x: x * 2).lower(jax.ShapeDtypeStruct((rows, 1024), jnp.float32))
    assert scratch_compiler_options(large, "cpu") == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tunable is glibc's")
def test_the_command_line_runs_in_the_tuned_environment(tmp_path):
    """`jaxformer bench train` records the environment it ran in; the CLI re-executed itself into it."""
    env = {key: value for key, value in os.environ.items() if key not in ("GLIBC_TUNABLES", "XLA_FLAGS")}
    out = tmp_path / "b.json"
    subprocess.run([sys.executable, "-m", "jaxformer.cli", "bench", "train", "--sizes", "16:1:16", "--batch", "2",
                    "--steps", "1", "--repeats", "1", "--no-torch", "--json", str(out)],
                   env=env, check=True, capture_output=True, timeout=300)
    report = json.loads(out.read_text())
    environment = report["variables"]
    assert environment["GLIBC_TUNABLES"] == ":".join(MALLOC_TUNABLES)
    assert (NO_YNN_FUSION in environment["XLA_FLAGS"]) == (usable_cores() == 1)  # fusions off on one device only
    assert f"{HOST_DEVICES}={usable_cores()}" in environment["XLA_FLAGS"]
    assert report["sizes"][0]["devices"] == min(2, usable_cores())  # data-parallel over the batch of 2


def test_a_single_threaded_sweep_process_gets_one_device(monkeypatch):
    assert f"{HOST_DEVICES}=1" in thread_environment(1)["XLA_FLAGS"]
    assert f"{HOST_DEVICES}=2" in thread_environment(2)["XLA_FLAGS"]
    monkeypatch.setenv("XLA_FLAGS", f"{HOST_DEVICES}=2")  # the tuned sweep process's own count
    flags = thread_environment(1)["XLA_FLAGS"].split()
    assert [flag for flag in flags if flag.startswith(HOST_DEVICES)] == [f"{HOST_DEVICES}=1"]
    assert NO_YNN_FUSION in flags


def test_a_sweep_process_of_n_threads_has_n_devices_as_jax_reads_its_flags(monkeypatch):
    """Read by XLA itself: it stops at the first entry of XLA_FLAGS that is not a --flag, and the device count
    after the bare ``intra_op_parallelism_threads=2`` of a widely copied recipe was dropped (one device, not two)."""
    monkeypatch.setenv("XLA_FLAGS", f"{HOST_DEVICES}=2")
    for threads in (1, 2, 3):
        env = thread_environment(threads)
        assert all(flag.startswith("--") for flag in env["XLA_FLAGS"].split())
        count = subprocess.run([sys.executable, "-c", "import jax; print(jax.device_count())"], env=env,
                               capture_output=True, text=True, check=True).stdout
        assert int(count) == threads
