"""A long loop inside one program over a mesh of CPU devices gives the values of its iterations run one by one.

With YNNPACK's fusions switched off (``--xla_cpu_experimental_ynn_fusion_type=``), jaxlib 0.10.2's two-device programs
came out wrong past some iteration of a loop on a large enough model: `jaxformer train` reported SmolLM2-135M's
validation loss as 10.35 nats for 4.85 (batches 28–63 of 64 scored ~14), and gradient accumulation's scan went
wrong alike. The tuned environment (`jaxformer.runtime`) now switches them off only in processes of one device.
"""

import json
import os
import subprocess
import sys

from jaxformer.runtime import HOST_DEVICES, NO_YNN_FUSION, tuned_environment
from jaxformer.sweep.executors import thread_environment

# the validation pass of `jaxformer train` (its layout, shardings and program) over 128 batches of a model shaped as
# SmolLM2's layers (d 576, 9 heads on 3 K/V heads, d_ff 1536) with 4 layers and a 16,384-token vocabulary, where
# the fusions-off program went wrong from batch 102 on; against each batch's loss from a one-device program
SCRIPT = """
import json, numpy as np, jax, jax.numpy as jnp
from flax import nnx
from jaxformer.models import ModelConfig
from jaxformer.models.build import build_model
from jaxformer.parallel import Layout
from jaxformer.parallel.config import ParallelConfig
from jaxformer.train.step import make_eval_pass, next_token_loss
cfg = ModelConfig(vocab_size=16384, d_model=576, num_layers=4, num_heads=9, num_kv_heads=3, head_dim=64, d_ff=1536,
                  max_seq_len=32, position="rope", activation="swiglu", norm="rmsnorm", use_bias=False)
graphdef, params = nnx.split(build_model(cfg, rngs=nnx.Rngs(0)))
params = jax.tree.map(lambda x: 4 * x, params)  # logits far from uniform, so that a wrong batch shows
val = np.random.default_rng(0).integers(0, cfg.vocab_size, (128, 2, 33)).astype(np.int32)
layout = Layout.for_run(ParallelConfig(), cfg, 2)
shardings, batches = layout.shardings(params), layout.batch_sharding(val.shape, batch_dim=1)
on_mesh = make_eval_pass(graphdef, "float32", params_sharding=shardings, batch_sharding=batches)
mesh_loss = float(on_mesh(jax.device_put(params, shardings), layout.global_array(val, batches, val.shape)))
one = jax.jit(lambda p, w: next_token_loss(graphdef, p, w, jnp.float32, drop_tokens=False)[1])
one_by_one = float(np.mean([one(params, b) for b in val]))
print(json.dumps({"devices": jax.device_count(), "mesh": mesh_loss, "one_by_one": one_by_one}))
"""


def test_the_tuned_environment_keeps_ynnpack_fusions_off_only_on_one_device(monkeypatch):
    assert NO_YNN_FUSION not in tuned_environment({"XLA_FLAGS": f"{HOST_DEVICES}=2"})["XLA_FLAGS"]
    assert tuned_environment({"XLA_FLAGS": f"{HOST_DEVICES}=1"})["XLA_FLAGS"] == f"{NO_YNN_FUSION} {HOST_DEVICES}=1"
    assert tuned_environment({"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=dot"})["XLA_FLAGS"].startswith(
        "--xla_cpu_experimental_ynn_fusion_type=dot ")  # the user's own setting stays
    monkeypatch.setenv("XLA_FLAGS", f"{HOST_DEVICES}=2")
    monkeypatch.delenv("JAXFORMER_TUNE", raising=False)
    assert thread_environment(1)["XLA_FLAGS"] == (f"{NO_YNN_FUSION} --xla_cpu_multi_thread_eigen=false "
                                                  f"{HOST_DEVICES}=1")  # a sweep worker
    assert thread_environment(2)["XLA_FLAGS"] == (f"--xla_cpu_multi_thread_eigen=true "
                                                  f"{HOST_DEVICES}=2")  # two threads: a device each, no fusions off
    assert thread_environment(2)["OMP_NUM_THREADS"] == thread_environment(2)["OPENBLAS_NUM_THREADS"] == "2"
    assert thread_environment(0) == dict(os.environ)  # no limit: the environment as it is
    monkeypatch.setenv("JAXFORMER_TUNE", "0")
    assert NO_YNN_FUSION not in thread_environment(1)["XLA_FLAGS"]


def test_a_long_validation_pass_over_two_devices_equals_its_batches_one_by_one():
    env = tuned_environment({key: value for key, value in os.environ.items()
                             if key not in ("XLA_FLAGS", "JAXFORMER_TUNE")} | {"XLA_FLAGS": f"{HOST_DEVICES}=2"})
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["devices"] == 2
    assert abs(result["mesh"] - result["one_by_one"]) <= 1e-5 * result["one_by_one"], result


def test_on_a_mesh_a_one_micro_batch_train_step_keeps_the_fusions_off_and_the_validation_pass_does_not(tmp_path):
    """The speed of YNNPACK's fusions off (docs/cpu-speed.md) stays with the train step, which runs no long loop; the
    validation pass, which loops over its batches, compiles with them on (as do steps of several micro-batches)."""
    script = """
import json, jax, numpy as np
from jaxformer.parallel import Layout
from jaxformer.train import compiled
from jaxformer.train.config import load_config
from jaxformer.train.optimizer import make_optimizer
config = load_config(None, ["model.preset=tiny", "model.d_model=32", "model.num_layers=1", "train.batch_size=4",
                            "train.seq_len=16"])
layout = Layout.for_run(config.parallel, config.model, config.micro_batch)
optimizer = make_optimizer(config.optimizer)
graphdef, abstract, init = compiled.initial_state(config.model, config.kernel, config.optimizer, optimizer, layout)
state = init(0)
report = {"devices": jax.device_count()}
for accum in (1, 2):
    batch = jax.ShapeDtypeStruct((accum, 4, 17), np.int32, sharding=layout.batch_sharding((accum, 4, 17), batch_dim=1))
    val = layout.global_array(np.zeros((3, 4, 17), np.int32), layout.batch_sharding((3, 4, 17), 1), (3, 4, 17))
    step, eval_pass, _ = compiled.compiled_steps(graphdef, config.optimizer, optimizer, "float32", layout, state,
                                                 batch, val)
    report[accum] = ["__ynn_fusion" in program.as_text() for program in (step, eval_pass)]
print(json.dumps(report))
"""
    env = tuned_environment({key: value for key, value in os.environ.items()
                             if key not in ("XLA_FLAGS", "JAXFORMER_TUNE")} | {"XLA_FLAGS": f"{HOST_DEVICES}=2"})
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"devices": 2, "1": [False, True], "2": [True, True]}
