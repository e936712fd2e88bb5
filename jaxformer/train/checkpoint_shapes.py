"""Whether a run directory's checkpoints hold the model a config asks for, read from their metadata alone.

Checkpoints of another model (a run directory trained before with another ``model.d_model``, say)
are not corrupt: restoring them fails, but they are a user's valid files. Orbax records every saved
array's name, shape and dtype in the step's metadata, so they are told apart without reading an
array: `refuse_another_model` raises `CheckpointMismatch`, bad input, naming the first array that
differs, before training writes anything or any step is moved (`jaxformer.train.checkpoint`).
Metadata that does not read is left for restoring to judge: that step is corrupt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxformer.parallel.distributed import exchange


class CheckpointMismatch(ValueError):
    """The checkpoints hold another model's arrays (other names, shapes or dtypes): bad input, never set aside."""


def _flat(tree: Any) -> dict[str, Any]:
    """``tree``'s leaves by dotted path, as Orbax names a saved state's arrays (``params.….value``)."""
    def name(key: Any) -> str:
        return str(getattr(key, "key", getattr(key, "idx", getattr(key, "name", key))))

    return {".".join(map(name, path)): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _model_difference(step_dir: Path, wanted: dict[str, Any], only: str | None) -> str | None:
    """How the arrays saved in ``step_dir`` differ from ``wanted`` (`_flat` of an abstract state), naming the first
    leaf (parameters first); None when they agree, or when the metadata does not read (restoring judges that).
    ``only``: compare the saved arrays under this top-level key alone (``params``: a reader of the parameters)."""
    try:
        saved = _flat(ocp.StandardCheckpointHandler().metadata(step_dir / "state"))
    except Exception:  # noqa: BLE001 — unreadable metadata is a corrupt step's, not another model's
        return None
    if only is not None:
        saved = {name: leaf for name, leaf in saved.items() if name.startswith(f"{only}.")}

    def describe(leaf: Any) -> str:
        return "absent" if leaf is None else f"{tuple(leaf.shape)} {np.dtype(leaf.dtype)}"

    params_first = sorted(saved.keys() | wanted.keys(), key=lambda name: (not name.startswith("params."), name))
    differ = [name for name in params_first if describe(saved.get(name)) != describe(wanted.get(name))]
    if not differ:
        return None
    others = f" (and {len(differ) - 1} other arrays)" if len(differ) > 1 else ""
    return (f"{differ[0]} is {describe(saved.get(differ[0]))} there, {describe(wanted.get(differ[0]))} in the config's "
            f"model{others}")


def refuse_another_model(directory: Path, steps: Sequence[int], abstract_state: Any, only: str | None = None) -> None:
    """Raises `CheckpointMismatch` (one line: the step, the first differing leaf, both shapes) when a step of
    ``steps`` in ``directory`` holds other arrays than ``abstract_state`` (``only``: as `_model_difference`); every
    process raises alike."""
    wanted, reason = _flat(abstract_state), ""
    for step in reversed(steps):
        if difference := _model_difference(Path(directory) / str(step), wanted, only):
            reason = (f"checkpoint step {step} in {directory} holds another model: {difference}; train it with the "
                      "config that saved it, or use a new train.run_dir")
            break
    reasons = [each.decode() for each in exchange("another-model", reason.encode()) if each]
    if reasons:
        raise CheckpointMismatch(reasons[0])
