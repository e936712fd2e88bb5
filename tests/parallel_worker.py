"""Trains a GQA and a MoE model a few steps on several meshes of 8 CPU devices; run by ``tests/test_parallel.py``.

``XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/parallel_worker.py OUT_DIR`` writes

- ``OUT_DIR/{model}-{mesh}.npz`` (`Trainer.train`): per step ``k`` (1-based) the loss
  ``loss{k}`` the train step reported, the gradient ``grad{k}/{path}`` it took (fp32) and the
  parameters ``params{k}/{path}`` after it; for the meshes also ``forced_…{k}``, the same for
  step ``k`` taken from the one-device run's state before it. ``mesh`` is ``ref`` (one
  device) or the ``data-fsdp-tensor-expert`` sizes, like ``2-2-2-1``;
- ``OUT_DIR/shards.json``: ``{run: {path: per-device shard shape}}`` of the batch (``batch``), every parameter and
  Adam moment, read from the arrays' first addressable shard;
- ``OUT_DIR/resumed.npz``: steps 4–5 of the GQA model trained 3 steps on ``2-2-2-1``,
  checkpointed, and restored onto ``8-1-1-1``; next to the one-device run's steps 4–5
  (``gqa-ref5.npz``) and the ``2-2-2-1`` run itself continued (``gqa-2-2-2-1-cont.npz``);
- ``OUT_DIR/bad.json``: ``{case: [exit code, stderr, files left in the run directory]}`` of
  ``jaxformer train`` given layouts that do not fit the model or the batch.

One process does all of it, so each model is compiled once per mesh.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.cli import main as cli
from jaxformer.parallel import Layout
from jaxformer.train.checkpoint import Checkpointer
from jaxformer.train.config import load_config
from jaxformer.train.optimizer import learning_rates, make_optimizer
from jaxformer.train.step import build_state, empty_sums, make_train_step, next_token_loss

BATCH, SEQ = 8, 16
BASE = ["model.d_model=32", "model.num_layers=1", "model.num_heads=4", "model.max_seq_len=16", "train.seq_len=16",
        f"train.batch_size={BATCH}", "optimizer.lr=1e-2"]
MODELS = {
    "gqa": BASE + ["model.num_kv_heads=2"],  # swiglu d_ff = 96
    # GELU experts, as in the moe-8x-top2 preset
    "moe": BASE + ["model.num_experts=4", "model.experts_per_token=2", "model.expert_d_ff=64", "model.activation=gelu"],
}
MESHES = {
    "gqa": [(8, 1, 1, 1), (1, 8, 1, 1), (2, 2, 2, 1), (1, 2, 4, 1)],
    # the MoE model on the meshes that split it otherwise than the GQA model does: its experts by tensor and by
    # expert; pure data and pure FSDP (the GQA model's) are inside 2-2-2-1 already
    "moe": [(2, 2, 2, 1), (1, 2, 4, 1), (1, 2, 2, 2)],
}
STEPS, TOTAL = 3, 5


def windows(step: int) -> np.ndarray:
    """Step ``step``'s ``[1, BATCH, SEQ + 1]`` windows, the same in every run: ``t[i+1] = t[i] + 3 mod 256``."""
    starts = np.random.default_rng(step).integers(0, 256, (1, BATCH, 1))
    return ((starts + 3 * np.arange(SEQ + 1)) % 256).astype(np.int32)


def path_of(key_path) -> str:
    return jax.tree_util.keystr(key_path, simple=True, separator="/").removesuffix("/value")


def record(prefix: str, k: int, grads, state) -> dict[str, np.ndarray]:
    """Step ``k``'s loss, gradients and updated parameters, on the host, named as `Trainer.train` says."""
    out = {f"{prefix}loss{k}": np.asarray(state["sums"]["loss"])}
    for name, tree in ((f"{prefix}grad{k}", grads), (f"{prefix}params{k}", state["params"])):
        out.update({f"{name}/{path_of(p)}": np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]})
    return out


class Trainer:
    """One model on one layout: the production train step plus a gradient probe with the same shardings.

    The initial state is created on the layout (``Layout.materialize``), or copied from ``like``
    (another `Trainer` of the same model), which saves compiling the initialisation once per mesh.
    """

    def __init__(self, overrides: list[str], layout: Layout, like: Trainer | None = None) -> None:
        config = load_config(None, overrides)
        self.layout = layout
        self.optimizer = make_optimizer(config.optimizer)
        self.lrs = learning_rates(config.optimizer, TOTAL)
        if like is None:
            self.graphdef, self.state = layout.materialize(lambda: build_state(config.model, 0, self.optimizer))
        else:
            self.graphdef, self.state = like.graphdef, jax.device_put(like.initial, layout.shardings(like.initial))
        self.initial = jax.device_get(self.state)
        self.sharding = layout.shardings(self.state)
        self.batch_sharding = layout.batch_sharding((1, BATCH, SEQ + 1), batch_dim=1)
        step = make_train_step(self.graphdef, self.optimizer, "float32", state_sharding=self.sharding,
                               batch_sharding=self.batch_sharding)
        grad = jax.grad(lambda p, w: next_token_loss(self.graphdef, p, w[0], jnp.float32)[0])
        # one program per mesh: the gradient the step is about to take, and the step (its shardings inside)
        self.grad_and_step = jax.jit(lambda state, w, lr: (grad(state["params"], w), step(state, w, lr)),
                                     in_shardings=(self.sharding, self.batch_sharding, layout.replicated),
                                     out_shardings=(self.sharding["params"], self.sharding))

    def train(self, first: int, last: int, forced: dict | None = None) -> dict[str, np.ndarray]:
        """Steps ``first … last``: ``loss{k}``, ``grad{k}/…`` and the updated ``params{k}/…`` of each.

        Each step's starting state is kept in ``self.before[k]`` (on the host). With ``forced``
        (another run's ``before``) step ``k`` is also taken from ``forced[k]`` placed on this mesh,
        giving ``forced_loss{k}``, ``forced_grad{k}/…`` and ``forced_params{k}/…``.
        """
        out, self.before = {}, {}
        for k in range(first, last + 1):
            batch = self.layout.global_array(windows(k), self.batch_sharding, (1, BATCH, SEQ + 1))
            self.state = {**self.state, "sums": jax.device_put(empty_sums(), self.layout.replicated)}
            self.before[k] = jax.device_get(self.state)
            if forced:
                grads, after = self.grad_and_step(jax.device_put(forced[k], self.sharding), batch, self.lrs[k - 1])
                out.update(record("forced_", k, grads, after))
            grads, self.state = self.grad_and_step(self.state, batch, self.lrs[k - 1])
            out.update(record("", k, grads, self.state))
        self.batch_shard = list(batch.addressable_shards[0].data.shape)
        return out

    def shard_shapes(self) -> dict[str, list[int]]:
        moments = self.state["opt_state"][1][0]  # clip_by_global_norm, then AdamW's ScaleByAdamState
        shapes = {}
        for prefix, tree in (("params", self.state["params"]), ("mu", moments.mu), ("nu", moments.nu)):
            for key_path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
                shapes[f"{prefix}/{path_of(key_path)}"] = list(leaf.addressable_shards[0].data.shape)
        return {**shapes, "batch": self.batch_shard}


def layout(sizes: tuple[int, ...], devices=None) -> Layout:
    overrides = [f"parallel.mesh.{axis}={size}" for axis, size in zip(("data", "fsdp", "tensor", "expert"), sizes)]
    return Layout.from_config(load_config(None, overrides).parallel, devices)


BAD = {
    "heads": ["model.d_model=48", "model.num_heads=6", "parallel.mesh.tensor=4"],
    "mlp": ["model.d_ff=90", "parallel.mesh.tensor=4"],
    "experts": ["model.num_experts=6", "parallel.mesh.expert=4"],
    "batch": ["train.batch_size=12", "parallel.mesh.data=8"],
    "mesh": ["parallel.mesh.data=3", "parallel.mesh.fsdp=1"],
}


def bad_inputs(out: Path) -> None:
    """``jaxformer train`` on layouts that cannot work: each must stop before compiling anything."""
    results = {}
    for case, overrides in BAD.items():
        run_dir = out / f"bad-{case}"
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli(["train", str(out / "empty.yaml"), *BASE, *overrides, "--run-dir", str(run_dir)])
        results[case] = [code, err.getvalue(), sorted(p.name for p in run_dir.iterdir())]
    (out / "bad.json").write_text(json.dumps(results, indent=1))


def main(out: Path) -> None:
    assert jax.device_count() == 8, jax.devices()
    out.mkdir(parents=True, exist_ok=True)
    (out / "empty.yaml").write_text("{}\n")
    bad_inputs(out)
    shards = {}
    for model, overrides in MODELS.items():
        reference = Trainer(overrides, layout((1, 1, 1, 1), jax.devices()[:1]))
        np.savez(out / f"{model}-ref.npz", **reference.train(1, STEPS))
        before = reference.before
        if model == "gqa":
            np.savez(out / "gqa-ref5.npz", **reference.train(STEPS + 1, TOTAL))
        for sizes in MESHES[model]:
            name = f"{model}-{'-'.join(map(str, sizes))}"
            trainer = Trainer(overrides, layout(sizes), like=reference)
            np.savez(out / f"{name}.npz", **trainer.train(1, STEPS, forced=before))
            shards[name] = trainer.shard_shapes()
            if name == "gqa-2-2-2-1":
                resume_on_another_mesh(trainer, overrides, out)
    (out / "shards.json").write_text(json.dumps(shards, indent=1))


def resume_on_another_mesh(trainer: Trainer, overrides: list[str], out: Path) -> None:
    """Checkpoint after step 3 on (2,2,2), restore onto (8,1,1), train steps 4–5 on both."""
    checkpointer = Checkpointer(out / "checkpoints", keep=1)
    checkpointer.save(STEPS, trainer.state, {"loader": {}})
    target = Trainer(overrides, layout((8, 1, 1, 1)), like=trainer)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target.state)
    step, target.state, _ = checkpointer.restore_latest(abstract)  # the digest check passes across meshes
    checkpointer.close()
    assert step == STEPS and int(target.state["step"]) == STEPS
    saved, restored = jax.device_get(trainer.state["params"]), jax.device_get(target.state["params"])
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(restored)))
    moved = jax.tree.leaves(target.state["params"])[0]
    assert moved.sharding.mesh.shape == target.layout.mesh.shape  # really on the (8,1,1) mesh now
    np.savez(out / "resumed.npz", **target.train(STEPS + 1, TOTAL))
    np.savez(out / "gqa-2-2-2-1-cont.npz", **trainer.train(STEPS + 1, TOTAL))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
