"""Reading a trained run without changing it: its config, its tokenizer and its newest parameters.

Commands that only read a run (`jaxformer generate`, results, fits) use these; they never write
into the run directory — an unreadable checkpoint is skipped and left where it is, since the
run may be training in another process. Only `jaxformer train` sets corrupt checkpoints aside.
"""

from __future__ import annotations

from pathlib import Path

import jax
from flax import nnx

from jaxformer.train.checkpoint import Checkpointer
from jaxformer.train.checkpoint_config import has_checkpoints
from jaxformer.train.config import TrainConfig, load_config
from jaxformer.train.optimizer import make_optimizer
from jaxformer.train.step import build_state
from jaxformer.train.tokenizer import BPETokenizer, ByteTokenizer


def load_run_config(run_dir: Path) -> TrainConfig:
    """The resolved training config a run saved (``RUN_DIR/config.yaml``)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a training run directory (it has no config.yaml)")
    return load_config(path)


def run_tokenizer(run_dir: Path, config: TrainConfig) -> ByteTokenizer | BPETokenizer:
    """The tokenizer the run trained with: bytes, or the BPE it saved as ``tokenizer.json``."""
    if config.data.tokenizer == "byte":
        return ByteTokenizer()
    path = Path(run_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} trained with data.tokenizer=bpe but has no tokenizer.json")
    return BPETokenizer.load(path)


def restore_params(run_dir: Path, config: TrainConfig | None = None) -> tuple[int, nnx.State] | None:
    """``(step, params)`` of the run's newest readable checkpoint, read-only; None when it has none.

    The abstract training state (parameters and optimizer state) is rebuilt from the run's
    config so Orbax restores exactly what training saved, onto one device of this process
    whatever the mesh that trained it. Raises `CheckpointError` when
    checkpoints exist but none can be read (they are left in place).
    """
    run_dir = Path(run_dir)
    if not has_checkpoints(run_dir):
        return None
    config = config or load_run_config(run_dir)
    _, abstract = jax.eval_shape(lambda: build_state(config.model, config.train.seed, make_optimizer(config.optimizer),
                                                    config.kernel))
    # onto this process's first device, whatever mesh saved it (without a target Orbax wants the saving topology)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device), abstract)
    checkpointer = Checkpointer(run_dir / "checkpoints", config.checkpoint.keep, read_only=True)
    try:
        step, state, _ = checkpointer.restore_latest(abstract)
    finally:
        checkpointer.close()
    return step, state["params"]
