"""`jaxformer.train.restore.restore_params` (what generate and export-hf read of a run): the parameters alone, bit for
bit as the whole train state holds them, never the optimizer state; past an unreadable step, with the files kept."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

from jaxformer.cli import main
from jaxformer.train.checkpoint import Checkpointer, CheckpointError, params_digest
from jaxformer.train.checkpoint_shapes import CheckpointMismatch
from jaxformer.train.optimizer import make_optimizer
from jaxformer.train.restore import load_run_config, restore_params
from jaxformer.train.step import build_state

# 10 steps of AdamW, saved at steps 5 and 10: moments that differ from the parameters and from zero
TINY_RUN = ["model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.max_seq_len=64",
            "data.corpus=synthetic-markov", "data.markov.bytes=200000", "train.batch_size=8", "train.seq_len=32",
            "train.tokens=2560", "train.eval_tokens=1024", "checkpoint.interval=5", "logging.progress=none",
            "logging.tensorboard=false"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("restore")
    (root / "empty.yaml").write_text("{}\n")
    assert main(["train", str(root / "empty.yaml"), *TINY_RUN, "--run-dir", str(root / "run")]) == 0
    return root / "run"


def _whole_state(run_dir: Path) -> tuple[int, dict]:
    """``(step, state)`` of the newest step, parameters, optimizer state and all, as training restores it."""
    config = load_run_config(run_dir)
    _, abstract = jax.eval_shape(lambda: build_state(config.model, config.train.seed,
                                                    make_optimizer(config.optimizer), config.kernel))
    checkpointer = Checkpointer(run_dir / "checkpoints", config.checkpoint.keep, read_only=True)
    try:
        step, state, _ = checkpointer.restore_latest(abstract)
    finally:
        checkpointer.close()
    return step, state


def _files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _assert_same(ours, theirs) -> None:
    ours, theirs = jax.tree_util.tree_leaves_with_path(ours), jax.tree_util.tree_leaves_with_path(theirs)
    assert [path for path, _ in ours] == [path for path, _ in theirs]
    for (path, a), (_, b) in zip(ours, theirs):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b)), jax.tree_util.keystr(path)


def test_the_parameters_alone_are_restored_bit_for_bit(trained):
    step, state = _whole_state(trained)
    restored_step, params = restore_params(trained)
    assert restored_step == step == 10
    _assert_same(params, state["params"])
    assert all(leaf.sharding.device_set == {jax.local_devices()[0]} for leaf in jax.tree.leaves(params))


def test_the_optimizer_state_is_not_read(trained, tmp_path):
    """restore_params read the whole train state and kept its parameters: a run whose config now builds another
    optimizer state (no gradient clipping: optax's chain without its clip stage) could not be restored for generate
    or export-hf. Now the parameters come back as they were saved."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["optimizer"]["grad_clip"] = 0.0
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    _, state = _whole_state(trained)
    restored_step, params = restore_params(run_dir)
    assert restored_step == 10
    _assert_same(params, state["params"])


def _corrupt(step_dir: Path) -> None:
    for chunk in step_dir.rglob("d/*"):
        chunk.write_bytes(b"\0" * chunk.stat().st_size)  # same sizes, wrong bytes


def test_an_unreadable_newest_step_falls_back_and_stays_in_place(trained, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    _corrupt(run_dir / "checkpoints" / "10")
    before = _files(run_dir)
    _, older = _whole_state(run_dir)  # step 5, the whole state's own fallback: the reference
    capsys.readouterr()
    step, params = restore_params(run_dir)
    assert step == 5
    _assert_same(params, older["params"])
    err = capsys.readouterr().err
    assert err.startswith("warning: checkpoint steps [10] are unreadable (") and err.count("\n") == 1, err
    assert err.endswith("restored step 5, leaving them in place\n") and _files(run_dir) == before

    _corrupt(run_dir / "checkpoints" / "5")
    before = _files(run_dir)
    with pytest.raises(CheckpointError, match=r"none of the checkpoints \[5, 10\] in .* could be restored \(step 10: "
                                              r".*\); they were left in place"):  # the newest step's reason
        restore_params(run_dir)
    assert _files(run_dir) == before


def _meta(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / str(step) / "meta" / "metadata"


def test_parameters_unlike_their_digest_are_skipped_and_older_checkpoints_read_unchecked(trained, tmp_path, capsys):
    """The parameters' own digest, saved beside the whole state's, is what the parameters read alone are checked
    against (the whole state's needs the optimizer state): a step whose parameters differ from it is skipped."""
    _, state = _whole_state(trained)
    assert json.loads(_meta(trained, 10).read_text())["params_digest"] == params_digest(state["params"])
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    meta = json.loads(_meta(run_dir, 10).read_text())
    _meta(run_dir, 10).write_text(json.dumps({**meta, "params_digest": "0" * 64}))  # as if the arrays had changed
    capsys.readouterr()
    assert restore_params(run_dir)[0] == 5
    assert "checkpoint steps [10] are unreadable (ValueError: parameter contents do not match the digest saved " \
           "with them)" in capsys.readouterr().err
    del meta["params_digest"]  # a checkpoint saved before the parameters had a digest of their own
    _meta(run_dir, 10).write_text(json.dumps(meta))
    step, params = restore_params(run_dir)
    assert step == 10 and capsys.readouterr().err == ""
    _assert_same(params, state["params"])


def test_another_models_parameters_are_refused_naming_the_first_that_differs(trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["model"]["d_model"] = 64
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    before = _files(run_dir)
    with pytest.raises(CheckpointMismatch, match=r"^checkpoint step 10 in .* holds another model: params\.\S+ is \(32, "
                                                 r"[\d, ]+\) float32 there, \(64, [\d, ]+\) float32 in the config's"):
        restore_params(run_dir)
    assert _files(run_dir) == before
