"""Sharding: meshes of 8 devices and two processes train like one device; weights are really split; bad layouts stop.

The multi-device runs happen in subprocesses (``tests/parallel_worker.py``, and two
``jaxformer train`` processes), because JAX fixes the device count when it starts.
Arrays are compared leaf by leaf as ``‖a − a_ref‖ / ‖a_ref‖`` (fp32), the largest over leaves
and steps reported.

Why a step is also taken from the one-device run's own state ("forced"): AdamW divides
each gradient entry by its own magnitude, so an entry near ``eps`` (~1e-9 here) that
differs in its third digit between reduction orders moves its weight by a visible
fraction of the learning rate. Runs that are the same to rounding therefore drift apart
at the ~1e-5 level after one update (MoE more, where the drift also shifts routing), and
the gradients along each run's own path differ by that drift, not by sharding. From the
same state, the mesh's step equals the single device's to ~5e-7.
"""

import fcntl
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxformer.cli import main
from jaxformer.parallel import mesh_shape
from jaxformer.parallel.distributed import initialize, launcher_detected, wait_for_coordinator
from jaxformer.train.checkpoint import Checkpointer
from jaxformer.parallel.config import DistributedConfig
from jaxformer.train.config import load_config
from jaxformer.train.loader import Loader
from jaxformer.train.loop import train
from jaxformer.train.optimizer import make_optimizer
from jaxformer.train.restore import restore_params
from jaxformer.train.step import build_state
from parallel_worker import MESHES
from process_helpers import free_port, last_lines

WORKER = Path(__file__).with_name("parallel_worker.py")
RUNS = [(model, "-".join(map(str, sizes))) for model, meshes in MESHES.items() for sizes in meshes]
TOLERANCE = 1e-5


def _env(devices: int, flags: str = "") -> dict:
    return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {flags}".strip(),
            "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="session")
def worker(tmp_path_factory) -> Path:
    """The worker's output directory; under pytest-xdist the first test process to get here runs it for all."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # this run's directory, common to its xdist processes
    out = shared / "parallel-worker"
    with open(shared / "parallel-worker.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "shards.json").exists():  # written last
            # its programs (a step per model and mesh) compile without LLVM's optimisations (~40% of the time):
            # what is tested is how XLA partitions them over the mesh, which the backend's level leaves alone
            done = subprocess.run([sys.executable, str(WORKER), str(out)], capture_output=True,
                                  env=_env(8, "--xla_backend_optimization_level=0"),
                                  text=True, timeout=1200)
            assert done.returncode == 0, done.stderr[-3000:]
    return out


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / scale if scale else float(np.linalg.norm(a))


def _max_relative(run, reference, prefix: str, reference_prefix: str | None = None) -> float:
    """The largest `_relative` over leaves ``prefix…`` of ``run`` against ``reference_prefix…`` of ``reference``."""
    reference_prefix = reference_prefix or prefix
    keys = [k[len(prefix):] for k in run.files if k.startswith(prefix)]
    assert keys and len(keys) == len([k for k in reference.files if k.startswith(reference_prefix)])
    return max(_relative(run[prefix + k], reference[reference_prefix + k]) for k in keys)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "mesh"), RUNS)
def test_three_steps_on_a_mesh_match_one_device(worker, model, mesh):
    run, reference = np.load(worker / f"{model}-{mesh}.npz"), np.load(worker / f"{model}-ref.npz")
    drift_bound = TOLERANCE if model == "gqa" else 10 * TOLERANCE  # see the module docstring
    for k in (1, 2, 3):
        assert _relative(run[f"loss{k}"], reference[f"loss{k}"]) <= TOLERANCE
        assert _relative(run[f"forced_loss{k}"], reference[f"loss{k}"]) <= TOLERANCE
        assert _max_relative(run, reference, f"forced_grad{k}/", f"grad{k}/") <= TOLERANCE
        assert _max_relative(run, reference, f"grad{k}/") <= drift_bound
    assert float(reference["loss3"]) < float(reference["loss1"]) - 0.2  # it is learning


@pytest.mark.slow
def test_parameters_and_adam_moments_are_split_as_the_rules_say(worker):
    shards = json.loads((worker / "shards.json").read_text())
    attention, ffn = "decoder/blocks/0/attention", "decoder/blocks/0/feed_forward"
    # GQA: E=32, H=4 query heads, K=2 kv heads, D=8, F=96 (SwiGLU), V=256 (tied)
    expected = {
        "gqa-8-1-1-1": {"wq": [32, 4, 8], "wk": [32, 2, 8], "w_in": [32, 96], "tokens": [256, 32]},  # replicas
        "gqa-1-8-1-1": {"wq": [4, 4, 8], "wk": [4, 2, 8], "w_in": [4, 96], "tokens": [256, 4]},  # FSDP over E
        "gqa-2-2-2-1": {"wq": [16, 2, 8], "wk": [16, 1, 8], "w_in": [16, 48], "tokens": [128, 16]},
        # 2 kv heads cannot split 4 ways: kept whole on each tensor shard
        "gqa-1-2-4-1": {"wq": [16, 1, 8], "wk": [16, 2, 8], "w_in": [16, 24], "tokens": [64, 16]},
    }
    paths = {"wq": f"{attention}/wq", "wk": f"{attention}/wk", "w_in": f"{ffn}/w_in", "tokens": "embedding/tokens"}
    for run, shapes in expected.items():
        for name, shape in shapes.items():
            for tree in ("params", "mu", "nu"):
                assert shards[run][f"{tree}/{paths[name]}"] == shape, (run, tree, name)
        assert shards[run]["params/decoder/final_norm/scale"] == [32]  # norms replicated
    # MoE: 4 experts, expert width 64; experts [X, E, F], router [E, X]
    experts = f"{ffn}/experts/w_in_XEF"
    assert shards["moe-1-2-2-2"][f"params/{experts}"] == [2, 16, 32]  # two experts per expert shard
    assert shards["moe-1-2-2-2"][f"nu/{experts}"] == [2, 16, 32]
    assert shards["moe-1-2-2-2"][f"params/{ffn}/router"] == [16, 2]
    assert shards["moe-1-2-4-1"][f"params/{experts}"] == [4, 16, 16]
    # the batch [1, 8, 17] over (data, fsdp, expert): each device steps on its share of the sequences (a
    # replicated batch trains the same numbers, every device computing all of them)
    batch_ways = {"8-1-1-1": 8, "1-8-1-1": 8, "2-2-2-1": 4, "1-2-4-1": 2, "1-2-2-2": 4}
    for run in shards:
        assert shards[run]["batch"] == [1, 8 // batch_ways[run.split("-", 1)[1]], 17], run


@pytest.mark.slow
def test_a_checkpoint_saved_on_2x2x2_restores_onto_8x1x1_and_training_continues_identically(worker):
    resumed, continued = np.load(worker / "resumed.npz"), np.load(worker / "gqa-2-2-2-1-cont.npz")
    reference = np.load(worker / "gqa-ref5.npz")  # one device, steps 4 and 5 after the first three
    for k in (4, 5):
        assert _relative(resumed[f"loss{k}"], continued[f"loss{k}"]) <= TOLERANCE
        assert _relative(resumed[f"loss{k}"], reference[f"loss{k}"]) <= TOLERANCE
        assert _max_relative(resumed, reference, f"grad{k}/") <= TOLERANCE
    assert _max_relative(resumed, reference, "params5/") <= TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize(("case", "message"), [
    ("heads", "model.num_heads=6 is not divisible by parallel.mesh.tensor=4"),
    ("mlp", "model.d_ff=90 is not divisible by parallel.mesh.tensor=4"),
    ("experts", "model.num_experts=6 is not divisible by parallel.mesh.expert=4"),
    ("batch", "= 12 sequences per micro-batch is not divisible by "
              "parallel.mesh.data × parallel.mesh.fsdp × parallel.mesh.expert = 8"),
    ("mesh", "multiplies to 3 devices, but there are 8"),
])
def test_a_layout_that_does_not_fit_exits_2_with_one_line_before_compiling(worker, case, message):
    code, err, files = json.loads((worker / "bad.json").read_text())[case]
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err
    assert files == ["error.json"]  # stopped before the run directory (and any compilation)


def test_mesh_sizes_fill_the_remaining_devices_or_name_both_numbers():
    assert mesh_shape({"data": 2, "fsdp": -1, "tensor": 2, "expert": 1}, 8) == {
        "data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
    with pytest.raises(ValueError, match="the fixed axes multiply to 3, which does not divide the 8 devices"):
        mesh_shape({"data": 3, "fsdp": -1, "tensor": 1, "expert": 1}, 8)
    with pytest.raises(ValueError, match="multiplies to 4 devices, but there are 8"):
        mesh_shape({"data": 2, "fsdp": 2, "tensor": 1, "expert": 1}, 8)
    with pytest.raises(ValueError, match=r"^parallel.mesh.tensor must be positive or -1 \(all remaining devices\), "
                                         "got 0$"):
        load_config(None, ["parallel.mesh.tensor=0"])
    with pytest.raises(ValueError, match="^at most one parallel.mesh axis may be -1"):
        load_config(None, ["parallel.mesh.fsdp=-1"])  # data is -1 by default


def test_a_process_reads_only_its_rows_and_the_stream_advances_by_the_whole_batch():
    tokens = np.arange(1000) % 251
    whole, part = Loader(tokens, 16, 8, seed=3), Loader(tokens, 16, 8, seed=3)
    rows = np.array([4, 5, 6, 7])
    for _ in range(3):
        assert np.array_equal(part.next_batch(rows), whole.next_batch()[rows])
    assert part.state_dict() == whole.state_dict()


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:abc", "127.0.0.1:99999", ":1234"])
def test_a_coordinator_address_that_is_not_host_port_is_refused_in_one_line(address, capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    assert main(["train", str(config), f"parallel.distributed.coordinator_address={address}",
                 "parallel.distributed.num_processes=2", "parallel.distributed.process_id=0",
                 "--run-dir", str(tmp_path / "run")]) == 2
    assert (f"parallel.distributed.coordinator_address must be host:port (a port in 1-65535), got '{address}'"
            in capsys.readouterr().err)
    with pytest.raises(ValueError, match=f"^JAX_COORDINATOR_ADDRESS must be host:port .*, got '{re.escape(address)}'$"):
        initialize(DistributedConfig(), {"JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": "2"})


def test_a_coordinator_address_is_a_bracketed_v6_or_plain_host_and_a_port_in_1_to_65535():
    for valid in ("[::1]:1234", "127.0.0.1:1", "127.0.0.1:65535"):  # an IPv6 host in brackets; the ports' ends
        DistributedConfig(coordinator_address=valid).check()
    # a v6 host without brackets (or half of them) reads as host ":", port 1; ports 0 and 65536 do not exist
    for invalid in ("[::1]", "::1", "fe80::1", " :1", "[::1:1234", "::1]:1234", "127.0.0.1:0", "127.0.0.1:65536"):
        with pytest.raises(ValueError, match=f"got '{re.escape(invalid)}'$"):
            DistributedConfig(coordinator_address=invalid).check()


def test_distributed_start_up_is_off_unless_asked_for_or_launched_by_slurm_or_mpi():
    assert not initialize(DistributedConfig(), environ={})  # no call: a single process
    assert launcher_detected({"SLURM_STEP_NUM_TASKS": "2"}) and launcher_detected({"OMPI_COMM_WORLD_SIZE": "2"})
    assert not launcher_detected({"SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "8"})  # sbatch's own shell
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES must be an integer, got 'two'"):
        initialize(DistributedConfig(), environ={"JAX_NUM_PROCESSES": "two"})
    # asked for with nothing to go on: JAX's own reason, named as the section's (no address to check)
    with pytest.raises(ValueError, match=r"^parallel.distributed: .* \(set coordinator_address, num_processes and "):
        initialize(DistributedConfig(initialize=True), environ={})
    with pytest.raises(ValueError, match="process_id=2 must be below parallel.distributed.num_processes=2"):
        load_config(None, ["parallel.distributed.num_processes=2", "parallel.distributed.process_id=2"])


DIGESTS = """
import json, jax, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from jaxformer.train import checkpoint
mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Auto,) * 3)
rng = np.random.default_rng(0)
state = {"w": rng.standard_normal((12, 8)).astype(np.float32), "step": np.int32(7), "bf": rng.standard_normal((4, 6, 10)).astype("bfloat16"),
         "mask": rng.standard_normal(5) > 0, "i8": rng.integers(-100, 100, (8, 4)).astype(np.int8)}
layouts = [{"w": P("a", ("b", "c")), "bf": P(None, "c", "a"), "i8": P(("c", "a"))},  # split, partly replicated
           {"w": P(None, "b"), "bf": P(), "i8": P("b", "c")}, {"w": P(("c", "b")), "bf": P("b"), "i8": P(None, ("a", "b"))}]
placed = [{k: jax.device_put(v, NamedSharding(mesh, layout.get(k, P()))) for k, v in state.items()} for layout in layouts]
digests = [checkpoint.state_digest(state)] + [checkpoint.state_digest(leaves) for leaves in placed]
kinds = {(x.shape, str(x.dtype), x.sharding.spec) for leaves in placed for x in leaves.values()}
print(json.dumps({"digests": digests, "programs": checkpoint._sharded_fingerprint._cache_size(), "kinds": len(kinds)}))
"""


def test_the_state_digest_is_the_same_for_every_sharding_and_compiles_once_per_leaf_layout():
    """Each device reduces its own shard in one SPMD program per leaf layout (not one program per device)."""
    done = subprocess.run([sys.executable, "-c", DIGESTS], env=_env(8), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert len(set(result["digests"])) == 1 and len(result["digests"]) == 4
    assert result["programs"] == result["kinds"] == 11  # one per leaf shape, dtype and layout, for all 8 devices


CHOICE = """
import json, sys
from pathlib import Path
from jaxformer.parallel.config import DistributedConfig
from jaxformer.parallel.distributed import initialize
process, address, cache = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
assert initialize(DistributedConfig(coordinator_address=address, num_processes=2, process_id=process), {})
assert initialize(DistributedConfig(), {})  # again: a no-op, initialised
from jaxformer.train.kernel_choice import decide, fastest, on_every_process
timed = lambda: {"naive": 1.0, "fused": 0.5 if process == 0 else 2.0}  # process 0's timings decide
measured = decide(cache, "KEY", ["naive", "fused"], timed, fastest, "attention_impl")[:2]
only = on_every_process(["naive", "fused"] if process == 0 else ["naive"], "")  # a host without the fused kernel
print(json.dumps([measured, only]))
"""


def test_two_processes_on_one_host_choose_a_kernel_together_without_waiting_for_each_other(tmp_path):
    """Both take the same cache file: only process 0 takes its timing lock (process 1 waiting on it while process 0
    waits for process 1 was a deadlock), and the candidates are those every process has."""
    address = f"127.0.0.1:{free_port()}"
    lines = last_lines([[sys.executable, "-c", CHOICE, str(i), address, str(tmp_path / "kernel.json")]
                        for i in range(2)], _env(1), timeout=60)
    assert [json.loads(line) for line in lines] == [
        [["fused", "measured"], [["naive"], "fused: not on every process of the run"]], [["fused", "measured"], [["naive"], ""]]]


def test_a_peer_waits_for_the_coordinator_only_until_it_listens():
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert 0 <= wait_for_coordinator(f"127.0.0.1:{server.getsockname()[1]}", timeout=30) < 5  # seconds waited


def test_a_process_whose_peers_never_connect_stops_after_the_initialization_timeout():
    code = ("import sys; from jaxformer.parallel.config import DistributedConfig; "
            "from jaxformer.parallel.distributed import initialize; "
            "initialize(DistributedConfig(coordinator_address=sys.argv[1], num_processes=2, process_id=0, "
            "initialization_timeout=2), {})")
    started = time.perf_counter()  # the coordinator, and its peer never comes: JAX would wait 300 s
    done = subprocess.run([sys.executable, "-c", code, f"127.0.0.1:{free_port()}"], env=_env(1),
                          capture_output=True, text=True, timeout=200)
    # JAX's client ends the coordinator's process itself (SIGABRT) when the deadline passes
    assert done.returncode != 0 and time.perf_counter() - started < 60 and "DEADLINE_EXCEEDED" in done.stderr


def test_a_process_whose_coordinator_never_listens_exits_2_with_one_line(tmp_path):
    """Process 1 of 2, nothing at the coordinator's address: one line after the timeout (JAX's client aborted)."""
    config, address, started = tmp_path / "run.yaml", f"127.0.0.1:{free_port()}", time.perf_counter()
    config.write_text("{}\n")
    settings = [f"parallel.distributed.{setting}" for setting in (
        f"coordinator_address={address}", "num_processes=2", "process_id=1", "initialization_timeout=2")]
    done = subprocess.run([sys.executable, "-m", "jaxformer.cli", "train", str(config), *settings, "--run-dir",
                           str(tmp_path / "run")], env=_env(1), capture_output=True, text=True, timeout=200)
    assert 2 <= time.perf_counter() - started < 60
    assert (done.returncode, done.stderr) == (2, f"jaxformer train: error: parallel.distributed.coordinator_address "
                                                 f"{address}: no coordinator listening after 2 s "
                                                 f"(initialization_timeout): Connection refused\n")
    assert [path.name for path in (tmp_path / "run").iterdir()] == ["error.json"]  # the failed attempt's record


def test_one_device_mesh_product_mismatch_exits_2_before_anything_is_written(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    assert main(["train", str(config), "parallel.mesh.data=2", "parallel.mesh.fsdp=1",
                 "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "parallel.mesh data=2 × fsdp=1 × tensor=1 × expert=1 multiplies to 2 devices, but there are 1" in err
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["error.json"]


# one model and batch shape for the two-process run and its one-process reference
TWO_PROCESS = ["model.d_model=32", "model.num_layers=1", "model.num_heads=4", "model.num_kv_heads=2",
               "model.max_seq_len=16", "data.corpus=synthetic-markov", "data.markov.bytes=60000",
               "optimizer.lr=1e-2", "train.batch_size=8", "train.seq_len=16", "train.tokens=512",
               "train.eval_tokens=256", "train.peak_flops=1e12", "train.compilation_cache=", "logging.interval=1",
               "logging.progress=none", "logging.tensorboard=false"]


def _final_state(run_dir: Path):
    config = load_config(None, TWO_PROCESS)
    _, state = build_state(config.model, 0, make_optimizer(config.optimizer))
    checkpointer = Checkpointer(run_dir / "checkpoints", keep=1)
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    try:  # onto this process's single device, whatever mesh wrote it; the digest is checked on the way
        return checkpointer.restore_latest(target)[1]
    finally:
        checkpointer.close()


@pytest.mark.slow
def test_two_processes_with_four_devices_each_train_like_one_process(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    port, shared = free_port(), tmp_path / "two"
    # two saves (steps 2 and 4), the first under the overhead budget process 0's clock rules on
    layout = ["checkpoint.interval=2", "checkpoint.max_overhead=1e9",
              "parallel.mesh.data=2", "parallel.mesh.fsdp=2", "parallel.mesh.tensor=2",
              f"parallel.distributed.coordinator_address=127.0.0.1:{port}", "parallel.distributed.num_processes=2"]
    processes = [subprocess.Popen([sys.executable, "-m", "jaxformer.cli", "train", str(config), *TWO_PROCESS, *layout,
                                   f"parallel.distributed.process_id={i}", "--run-dir", str(shared)],
                                  env=_env(4), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                  for i in range(2)]
    record = train(load_config(None, TWO_PROCESS), tmp_path / "one")  # meanwhile: the one-device reference
    outputs = [p.communicate(timeout=900)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]

    rows = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for run in (shared, tmp_path / "one")]
    assert [row["step"] for row in rows[0]] == [1, 2, 3, 4] == [row["step"] for row in rows[1]]
    assert sorted(int(p.name) for p in (shared / "checkpoints").iterdir()) == [2, 4]
    for two, one in zip(*rows):
        assert two["train_loss"] == pytest.approx(one["train_loss"], rel=TOLERANCE)
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=TOLERANCE)
    assert json.loads((shared / "final.json").read_text())["val_loss"] == pytest.approx(record["val_loss"],
                                                                                        rel=TOLERANCE)
    # the sharded checkpoint both processes wrote restores onto this single device (its digest checked)
    two, one = (_final_state(run) for run in (shared, tmp_path / "one"))
    assert int(two["step"]) == 4
    # AdamW's drift (module docstring) after four updates: measured 6.9e-5; the updates themselves moved
    # each leaf by far more (0.9–71 % of its norm after three), so weights trained on other rows could not pass
    assert max(_relative(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(two["params"]), jax.tree.leaves(one["params"]))) <= 1e-3
    # what generate and export-hf read of a run trained on another mesh (its 8 devices here, 1 in this process)
    step, params = restore_params(shared)
    assert step == 4 and all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                                    jax.tree.leaves(two["params"])))
    assert main(["generate", str(shared), "--prompt", "ab", "--max-new-tokens", "2", "--temperature", "0"]) == 0


def test_the_default_mesh_is_data_parallel_over_the_most_devices_that_split_the_batch():
    """Default ``parallel.mesh.data=-1`` on 4 devices: every device for a batch of 8, 3 for 6, 1 for 5; the
    batch's other mesh axes are the rules' (a batch split over data × tensor, or over data alone, or over fsdp
    alone: a data axis that does not split the batch takes every device); fixed axes that do not divide the
    devices are refused, not trimmed to fit."""
    fsdp = "parallel.mesh.fsdp=2"
    cases = [([], 8), ([], 6), ([], 5), (["parallel.rules.batch=[data,tensor]", "parallel.mesh.tensor=2"], 2),
             (["parallel.rules.batch=[data]", fsdp], 2), ([fsdp], 6), ([fsdp], 3),
             (["parallel.rules.batch=[fsdp]", fsdp], 3), (["parallel.mesh.tensor=3"], 6)]
    code = ("import json, sys; from jaxformer.parallel import Layout; from jaxformer.train.config import load_config\n"
            "def shape(o, b):\n"
            "    try: return dict(Layout.from_config(load_config(None, o).parallel, micro_batch=b).mesh.shape)\n"
            "    except ValueError as e: return str(e)\n"
            "print(json.dumps([shape(o, b) for o, b in json.loads(sys.argv[1])]))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], env=_env(4), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    shapes = json.loads(done.stdout.strip().splitlines()[-1])
    assert [shape["data"] for shape in shapes[:3]] == [4, 3, 1]
    assert all(shape["fsdp"] == shape["tensor"] == shape["expert"] == 1 for shape in shapes[:3])
    assert shapes[3] == {"data": 1, "fsdp": 1, "tensor": 2, "expert": 1}  # 2 sequences over data 1 × tensor 2
    assert shapes[4] == {"data": 2, "fsdp": 2, "tensor": 1, "expert": 1}  # fsdp does not split this batch
    # neither 6 nor 3 sequences split over data 2 × fsdp 2: fsdp's two devices alone
    assert shapes[5] == shapes[6] == {"data": 1, "fsdp": 2, "tensor": 1, "expert": 1}
    assert shapes[7] == {"data": 2, "fsdp": 2, "tensor": 1, "expert": 1}  # data does not split this batch: all four
    assert shapes[8] == ("parallel.mesh data=-1 × fsdp=1 × tensor=3 × expert=1: the fixed axes multiply to 3, "
                         "which does not divide the 4 devices")
