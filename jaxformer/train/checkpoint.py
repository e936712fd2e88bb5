"""Orbax checkpoints of a run: the train state plus a JSON record, with fallback past bad ones.

Each step directory holds two items: ``state`` (parameters, optimizer state, step and the
metric accumulators, through ``StandardSave``) and ``meta`` (``JsonSave``: the loader's
position, wall time so far, a digest of every state array and one of the parameters alone). Orbax writes a step
into a temporary directory and renames it when complete, so a process killed mid-save
leaves no half-written step behind; ``max_to_keep`` keeps the last ``keep`` steps.

Restoring tries the newest step first. A step that fails to load, or whose arrays no longer
match their digest, is skipped with a warning and the previous step is tried — a run never
silently restarts from step 0 when checkpoints exist. Training moves such a step to
``RUN_DIR/corrupt_checkpoints/``; a read-only checkpointer (``read_only=True``: generation,
inspection) leaves every file where it is and writes nothing. A step whose metadata reads but
describes other arrays than the state asked for (another model's checkpoints: another
``d_model``, say) is not corrupt: `jaxformer.train.checkpoint_shapes` refuses it as bad input,
before any step is restored or moved.

Sharded state is saved sharded: each process writes the shards its devices hold. Restoring
into an abstract state whose ``ShapeDtypeStruct`` leaves carry other shardings (another mesh,
another number of processes) reads each device's shards straight into place. The digest is
computed on the devices and does not depend on the sharding, so it checks such restores too.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

from jaxformer.parallel.distributed import exchange
from jaxformer.train.checkpoint_shapes import refuse_another_model
from jaxformer.train.interrupts import deferred_interrupt
from jaxformer.train.late_reports import (failed_write_errno, failed_write_tracebacks_ignored,
                                          reads_outliving_their_loop_ignored)


class CheckpointError(RuntimeError):
    """Checkpoints exist but none of them can be restored."""


def _mix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser: every input bit flips each output bit with probability ~1/2."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _block_sums(block: jax.Array, start: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``[2]`` uint32: two sums over ``block``'s elements of a hash of (bits, flat index), mod 2³².

    ``block`` is the part of a leaf of shape ``shape`` that begins at ``start`` (``[ndim]`` uint32;
    the whole leaf when ``block.shape == shape``), and the index is the element's flat index in the
    leaf. Integer sums are exact in any order, so the blocks' sums add up to the leaf's, however the
    leaf is sharded.
    """
    x = block.astype(jnp.uint8) if block.dtype == jnp.bool_ else block
    if x.dtype.itemsize not in (1, 2, 4):
        raise TypeError(f"cannot fingerprint a {x.dtype} array")
    bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}")).astype(jnp.uint32)
    index = jnp.zeros(x.shape, jnp.uint32)
    for axis, size in enumerate(shape):
        index = index * jnp.uint32(size) + start[axis] + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis)
    return jnp.stack([jnp.sum(_mix32(bits + _mix32(index ^ jnp.uint32(seed))), dtype=jnp.uint32)
                      for seed in (0x9E3779B9, 0x7F4A7C15)])


# one program per leaf shape and dtype (and sharding): a state's leaves share a few (a parameter and its two AdamW
# moments, every layer's matrices), and so do the models of a sweep, where a program over a whole state would compile
# anew for every model
_fingerprint = jax.jit(_block_sums, static_argnames="shape")


@functools.partial(jax.jit, static_argnames="sharding")
def _sharded_fingerprint(leaf: jax.Array, sharding: NamedSharding) -> jax.Array:
    """``[devices, 2]`` uint32: row d the `_block_sums` of device d's shard of ``leaf`` (laid out by ``sharding``),
    zeros where that shard is a replica of another (an index other than 0 on a mesh axis the leaf is not split over).

    One SPMD program for every device, with no collective: each device reduces its own shard.
    """
    mesh = sharding.mesh
    parts = [p if isinstance(p, tuple) else (p,) if p else () for p in sharding.spec]
    parts += [()] * (leaf.ndim - len(parts))
    unsplit = tuple(axis for axis in mesh.axis_names if not any(axis in p for p in parts))

    def local(block):
        start = [jax.lax.axis_index(p).astype(jnp.uint32) * jnp.uint32(size) if p else jnp.uint32(0)
                 for p, size in zip(parts, block.shape)]
        sums = _block_sums(block, jnp.stack(start) if start else jnp.zeros(0, jnp.uint32), leaf.shape)
        replica = jax.lax.axis_index(unsplit) != 0 if unsplit else False
        return jnp.where(replica, jnp.uint32(0), sums)[None]

    return jax.shard_map(local, mesh=mesh, in_specs=sharding.spec, out_specs=PartitionSpec(mesh.axis_names),
                         check_vma=False)(leaf)


def _block_fingerprints(leaf: Any) -> list[jax.Array]:
    """Sums of ``leaf``'s blocks that this process holds once (its devices' shards that are no replica of another).

    Each device reduces its own shard, so no host ever holds the state, and no program has a
    collective: the processes' sums meet through `exchange`, outside XLA, so that a save's collectives
    cannot interleave in different orders with the programs and barriers around it.
    """
    if not isinstance(leaf, jax.Array) or (leaf.is_fully_addressable and len(leaf.sharding.device_set) == 1):
        # one block, as it is: a shard's data may carry another sharding than its leaf, and compile anew
        return [_fingerprint(leaf, np.zeros(np.ndim(leaf), np.uint32), np.shape(leaf))]
    if isinstance(leaf.sharding, NamedSharding):
        return [shard.data for shard in _sharded_fingerprint(leaf, leaf.sharding).addressable_shards]
    return [_fingerprint(shard.data, np.array([s.start or 0 for s in shard.index], np.uint32), leaf.shape)
            for shard in leaf.addressable_shards if shard.replica_id == 0]


def _local_sums(leaves: list[Any]) -> np.ndarray:
    """``[leaves, 2]`` uint64: per leaf, the sums of the `_fingerprint` s of the blocks this process holds once."""
    blocks = jax.device_get([_block_fingerprints(leaf) for leaf in leaves])
    return np.array([np.sum(np.array(b, np.uint64).reshape(-1, 2), axis=0) for b in blocks], np.uint64).reshape(-1, 2)


def _digest(leaves: list[Any], sums: list[np.ndarray]) -> str:
    """SHA-256 over every leaf's dtype, shape and fingerprint: ``sums``, every process's `_local_sums`, added."""
    fingerprints = (np.sum(sums, axis=0) % 2**32).astype(np.uint32)
    digest = hashlib.sha256()
    for leaf, fingerprint in zip(leaves, fingerprints):
        digest.update(f"{leaf.dtype}{tuple(np.shape(leaf))}".encode() + fingerprint.tobytes())
    return digest.hexdigest()


def _exchange_sums(name: str, local: np.ndarray | None) -> list[np.ndarray | None]:
    """Every process's `_local_sums` (None from a process that has none: it could not read the state)."""
    received = exchange(name, b"" if local is None else b"\x01" + local.tobytes())
    return [np.frombuffer(data[1:], np.uint64).reshape(-1, 2) if data else None for data in received]


def state_digest(state: Any) -> str:
    """SHA-256 over every leaf's dtype, shape and 64-bit content fingerprint (`_fingerprint`), in tree order.

    The same in every process of a multi-process run, and for every sharding of the same values.
    """
    return state_digests(state)["digest"]


def state_digests(state: Any) -> dict[str, str]:
    """``digest``: `state_digest`; ``params_digest``: the same over the leaves under ``state["params"]`` alone, which
    a reader of the parameters checks without reading the optimizer state (`jaxformer.train.restore`). One pass."""
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    leaves = [leaf for _, leaf in flat]
    sums = _exchange_sums("state-digest", _local_sums(leaves))
    rows = [i for i, (path, _) in enumerate(flat) if path and getattr(path[0], "key", None) == "params"]
    return {"digest": _digest(leaves, sums),
            "params_digest": _digest([leaves[i] for i in rows], [each[rows] for each in sums])}


def params_digest(params: Any) -> str:
    """`state_digests`' ``params_digest``, of parameters read without the rest of their state."""
    leaves = jax.tree.leaves(params)
    return _digest(leaves, _exchange_sums("params-digest", _local_sums(leaves)))


class Checkpointer:
    """Saves and restores ``(state, meta)`` under ``directory``.

    read_only: only restore; never create, clean up or move anything under ``directory``.
    kept_steps: steps kept besides the newest ``keep`` (`CheckpointConfig.steps`).
    asynchronous: `save` returns once Orbax has taken the state, and Orbax finishes the write in the
      background; `wait` (and `close`) block until it is on disk.
    """

    def __init__(self, directory: Path, keep: int, *, read_only: bool = False, kept_steps: Sequence[int] = (),
                 asynchronous: bool = False) -> None:
        self.directory = Path(directory).absolute()
        self.read_only, self.asynchronous = read_only, asynchronous
        self.saving: int | None = None  # the step of the last save, until it is on disk
        policies, kept = ocp.checkpoint_managers, list(kept_steps)
        # Orbax takes max_to_keep or a preservation policy, not both; kept steps need the policy (newest `keep` or kept)
        policy = policies.AnyPreservationPolicy([policies.LatestN(keep), policies.CustomSteps(kept)]) if kept else None
        # read_only: Orbax warns (through absl) once for each option read_only implies and once for read_only itself
        with _absl_warnings_off() if read_only else contextlib.nullcontext():
            options = ocp.CheckpointManagerOptions(
                max_to_keep=None if kept else keep, preservation_policy=policy,
                create=not read_only, enable_async_checkpointing=asynchronous and not read_only,
                cleanup_tmp_directories=not read_only, read_only=read_only,
            )
            self.manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any, meta: dict) -> None:
        """Writes step ``step``; ``meta`` must be JSON-serialisable."""
        meta = {**meta, "step": step, **state_digests(state)}
        self.wait()  # Orbax waits for the previous save anyway: its failure is named by its own step
        with deferred_interrupt(), self._writing(step):
            self.manager.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                force=True,
            )
        if not self.asynchronous:
            self.wait()

    def wait(self) -> None:
        """Blocks until every save is written (Orbax raises here if a background write failed)."""
        with deferred_interrupt(), self._writing(self.saving):
            self.manager.wait_until_finished()
        self.saving = None

    @contextlib.contextmanager
    def _writing(self, step: int | None) -> Iterator[None]:
        """Raises a failed write of ``step`` as an ``OSError`` (a full disk: ``ENOSPC``) in one line, not as the
        ValueError TensorStore raises, which reads as bad input; Orbax's own tracebacks of it (absl's logger, in each
        thread the error reaches) are dropped meanwhile (`failed_write_tracebacks_ignored`)."""
        self.saving = step
        try:
            with failed_write_tracebacks_ignored():
                yield
        except Exception as error:
            code = failed_write_errno(error)
            if code is None:
                raise
            raise OSError(code, f"cannot save checkpoint step {step} in {self.directory}: {os.strerror(code)}") \
                from error

    @reads_outliving_their_loop_ignored()
    def restore_latest(self, abstract_state: Any, *, model_checked: bool = False) -> tuple[int, Any, dict] | None:
        """``(step, state, meta)`` of the newest readable step; None when there is no checkpoint.

        abstract_state: a tree of ``jax.ShapeDtypeStruct`` (with shardings) shaped like the state.
        Raises `CheckpointError` when steps exist but none restores, `CheckpointMismatch` (moving nothing) when
        one holds another model's arrays (`refuse_another_model`).
        model_checked: the caller has refused another model's steps already, and no step was added since
          (training: `jaxformer.train.prepare.prepare_run`, before anything was written); every process passes alike.
        """
        steps, unreadable = self.steps(), []
        if not model_checked:  # each step's metadata read: on a small run it costs more than the restore itself
            refuse_another_model(self.directory, steps, abstract_state)
        for step in reversed(steps):
            failure = local = None
            try:
                restored = self.manager.restore(
                    step,
                    args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()),
                )
                state, meta = restored["state"], dict(restored["meta"])
                local = _local_sums(jax.tree.leaves(state))
            except Exception as error:  # noqa: BLE001 — any failure to read a step means: try the previous one
                failure = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
            # one exchange per step in every process, whatever this one met, so that all judge each step alike
            sums = _exchange_sums("restore", local)
            missing = [process for process, each in enumerate(sums) if each is None]
            if failure is None and missing:
                failure = f"process {missing[0]} could not read it"
            if failure is None and _digest(jax.tree.leaves(state), sums) != meta.get("digest"):
                failure = "ValueError: array contents do not match the digest saved with them"
            if failure is not None:
                unreadable.append((step, failure))
                if not self.read_only:
                    self._set_aside(step, failure)
                continue
            if unreadable and self.read_only:  # one line for all the skipped steps
                print(f"warning: checkpoint steps {[s for s, _ in unreadable]} are unreadable ({unreadable[0][1]}); "
                      f"restored step {step}, leaving them in place", file=sys.stderr)
            return step, state, meta
        if steps:
            where = "they were left in place" if self.read_only else f"they were moved to {self._corrupt_dir()}"
            raise CheckpointError(f"none of the checkpoints {steps} in {self.directory} could be restored "
                                  f"(step {unreadable[0][0]}: {unreadable[0][1]}); {where} (start a new run directory to begin again)")
        return None

    def _corrupt_dir(self) -> Path:
        return self.directory.parent / "corrupt_checkpoints"

    def _set_aside(self, step: int, reason: str) -> None:
        """Training moves an unreadable step out of the way, and says so."""
        print(f"warning: checkpoint step {step} is unreadable ({reason}); moving it to {self._corrupt_dir()} "
              "and falling back to the previous one", file=sys.stderr)
        source = self.directory / str(step)
        if source.exists() and jax.process_index() == 0:  # one process moves it, for all
            target = self._corrupt_dir() / str(step)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                shutil.rmtree(target)
            shutil.move(str(source), str(target))
        exchange("set-aside", b"")  # the others reload once it has moved
        self.manager.reload()

    def close(self) -> None:
        with deferred_interrupt(), self._writing(self.saving):
            self.manager.close()


@contextlib.contextmanager
def _absl_warnings_off() -> Iterator[None]:
    """Orbax's warnings (absl's Python logger) held back inside the block; errors still show."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
