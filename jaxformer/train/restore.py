"""Reading a trained run without changing it: its config, its tokenizer and its newest parameters.

Commands that only read a run (`jaxformer generate`, results, fits) use these; they never write
into the run directory — an unreadable checkpoint is skipped and left where it is, since the
run may be training in another process. Only `jaxformer train` sets corrupt checkpoints aside.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx

from jaxformer.train.checkpoint import Checkpointer, CheckpointError, params_digest
from jaxformer.train.checkpoint_config import has_checkpoints
from jaxformer.train.checkpoint_shapes import refuse_another_model
from jaxformer.train.config import TrainConfig, load_config
from jaxformer.train.late_reports import reads_outliving_their_loop_ignored
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


@reads_outliving_their_loop_ignored()  # the late TensorStore reports of a failed restore
def restore_params(run_dir: Path, config: TrainConfig | None = None) -> tuple[int, nnx.State] | None:
    """``(step, params)`` of the run's newest readable checkpoint, read-only; None when it has none.

    Only the parameters are read (Orbax's partial restore): the optimizer state, twice their size under AdamW,
    stays on disk. Their abstract tree is rebuilt from the run's config, onto one device of this process whatever
    the mesh that trained it. A step that does not read, or whose parameters do not match the digest saved with
    them (``params_digest``; checkpoints written before it was saved are read unchecked), is skipped for the one
    before (one warning line); raises `CheckpointError` when checkpoints exist but none reads (they are left in
    place), `CheckpointMismatch` when they hold another model's parameters than the config's.
    """
    run_dir = Path(run_dir)
    if not has_checkpoints(run_dir):
        return None
    config = config or load_run_config(run_dir)
    _, abstract = jax.eval_shape(lambda: build_state(config.model, config.train.seed, make_optimizer(config.optimizer),
                                                    config.kernel))
    # onto this process's first device, whatever mesh saved it (without a target Orbax wants the saving topology)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    item = {"params": jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device),
                                   abstract["params"])}
    args = ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True),
        meta=ocp.args.JsonRestore())
    checkpointer = Checkpointer(run_dir / "checkpoints", config.checkpoint.keep, read_only=True)
    try:
        steps, unreadable = checkpointer.steps(), []
        refuse_another_model(checkpointer.directory, steps, item, only="params")
        for step in reversed(steps):
            try:
                restored = checkpointer.manager.restore(step, args=args)
                params, saved = restored["state"]["params"], restored["meta"].get("params_digest")
                if saved is not None and params_digest(params) != saved:
                    raise ValueError("parameter contents do not match the digest saved with them")
            except Exception as error:  # noqa: BLE001 — any failure to read a step means: try the previous one
                unreadable.append((step, f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"))
                continue
            if unreadable:  # one line for all the skipped steps
                print(f"warning: checkpoint steps {[s for s, _ in unreadable]} are unreadable ({unreadable[0][1]}); "
                      f"restored step {step}, leaving them in place", file=sys.stderr)
            return step, params
    finally:
        checkpointer.close()
    if not steps:  # step directories Orbax does not count as steps
        return None
    raise CheckpointError(f"none of the checkpoints {steps} in {checkpointer.directory} could be restored "
                          f"(step {unreadable[0][0]}: {unreadable[0][1]}); they were left in place "
                          "(start a new run directory to begin again)")
