"""A run directory before its training: every check of the run's input, then its first files.

`prepare_run` runs every check that can fail on user input (resume compatibility, the corpus and its hash, memory,
sizes, the checkpoints' model, a finished or damaged ``final.json``: `jaxformer.train.final`; a directory holding
files a run writes where no run began: `refuse_others_files`) before anything is written to the run directory;
`begin_run` then writes ``data.json`` (corpus description and hash: first, so a run killed at any later point has
begun), the resolved ``config.yaml`` and, for BPE, ``tokenizer.json`` (from ``model.init_from``: with its
``hf.json``, ``tokenizer_config.json`` and ``generation_config.json``). The loop (`jaxformer.train.loop`) and runs
trained together (`jaxformer.train.together`) both begin here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
import yaml

from jaxformer.accounting import count_params
from jaxformer.configs import load_yaml
from jaxformer.files import load_json, write_json_atomic, write_text_atomic
from jaxformer.parallel import Layout, initialize as initialize_distributed
from jaxformer.train.checkpoint_config import has_checkpoints, saved_steps
from jaxformer.train.checkpoint_shapes import refuse_another_model
from jaxformer.train.compiled import initial_state
from jaxformer.train.config import TrainConfig, config_to_dict, resume_conflict
from jaxformer.train.dataset import Dataset, prepare_dataset
from jaxformer.train.final import finished_record
from jaxformer.train.from_checkpoint import checkpoint_tokenizer, keep_token_metadata
from jaxformer.train.optimizer import make_optimizer


# what a run writes into its directory besides final.json and error.json (`begin_run`, the loop, the metrics logger)
RUN_FILES = ("data.json", "config.yaml", "tokenizer.json", "hf.json", "tokenizer_config.json", "generation_config.json",
             "checkpoints", "metrics.jsonl", "tensorboard")


class NotARunDirectory(ValueError):
    """A fresh run's directory holds a file a run writes, but no run began there: the file is the user's."""


def check_resume(config: TrainConfig, run_dir: Path) -> bool:
    """Whether the run resumes: ``run_dir`` holds checkpoints, or the ``final.json`` of a run that finished (its
    checkpoints removed or never kept); raises ``ValueError`` when the run directory holds a different run, or
    (a fresh start) files of no run (`refuse_others_files`)."""
    finished = (run_dir / "final.json").is_file()
    held = "checkpoints" if has_checkpoints(run_dir) else "a finished run" if finished else None
    if held is None:  # a fresh start, also over a run that diverged or was stopped before its first checkpoint
        refuse_others_files(run_dir)
        return False
    if not config.checkpoint.resume:
        raise ValueError(f"checkpoint.resume=false but {run_dir} holds {held}; use a new train.run_dir")
    saved = run_dir / "config.yaml"
    if saved.is_file():
        conflict = resume_conflict(load_yaml(saved), config)  # a damaged file: one line naming it
        if conflict:
            raise ValueError(f"cannot resume {run_dir}: {conflict} (use a new train.run_dir)")
    return True


def refuse_others_files(run_dir: Path) -> None:
    """Raises `NotARunDirectory` naming the first of `RUN_FILES` in ``run_dir`` when no run began there (`run_began`):
    a folder of the user's own ``metrics.jsonl``, ``config.yaml`` or ``tensorboard/``, whose files a fresh run would
    replace, truncate or add to. A run begun there (stopped, diverged, failed) is started again over its own files."""
    if run_began(run_dir):
        return
    for name in RUN_FILES:
        if (run_dir / name).exists():
            raise NotARunDirectory(f"{run_dir / name} is not a run's: {run_dir} holds no run (no data.json record of "
                                   "one), and a run there would replace it; give another run directory, or move it")


def run_began(run_dir: Path) -> bool:
    """Whether a run began in ``run_dir``: its ``data.json`` (the first file `begin_run` writes, and the first a
    sweep's branch is seeded with) is a run's corpus record, a JSON object with the corpus's ``sha256``."""
    try:
        saved_corpus_hash(run_dir / "data.json")
    except (OSError, ValueError):
        return False
    return True


def _check_host_memory(config: TrainConfig, runs: int = 1) -> None:
    """On a CPU, one fp32 copy of the training state (parameters, gradients, two AdamW moments) of each of
    ``runs`` runs held at once must fit in RAM."""
    if jax.default_backend() != "cpu":
        return
    need = 16 * count_params(config.model).total * runs
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        held = f"{runs} training states" if runs > 1 else "training state"
        raise ValueError(f"the model has {count_params(config.model).total:,} parameters, whose {held} needs "
                         f"{need / 2**30:,.1f} GiB, more than this machine's {have / 2**30:,.1f} GiB of memory")


def prepare_run(config: TrainConfig, run_dir: Path, runs: int = 1) -> tuple[Layout, Dataset, dict | None]:
    """Every check of a run's input, before anything is written: ``(layout, dataset, final)``, ``final`` the
    ``final.json`` record of a run that has finished, else None. ``runs``: states held at once (the memory check)."""
    initialize_distributed(config.parallel.distributed)
    _check_host_memory(config, runs)
    layout = Layout.for_run(config.parallel, config.model, config.micro_batch)
    resuming = check_resume(config, run_dir)
    dataset = prepare_dataset(config, run_dir / "tokenizer.json" if resuming else checkpoint_tokenizer(config))
    if resuming and (run_dir / "data.json").is_file():
        saved = saved_corpus_hash(run_dir / "data.json")
        if saved != dataset.info["sha256"]:
            raise ValueError(f"cannot resume {run_dir}: the contents of data.corpus {config.data.corpus!r} changed "
                             f"(sha256 {saved[:12]}… then, {dataset.info['sha256'][:12]}… now)")
    if resuming and (run_dir / "final.json").is_file() and (final := finished_run(run_dir)) is not None:
        return layout, dataset, final
    if steps := saved_steps(run_dir):  # another model's checkpoints are the user's valid files: refused, kept
        abstract = initial_state(config.model, config.kernel, config.optimizer, make_optimizer(config.optimizer),
                                 layout)[1]
        refuse_another_model(run_dir / "checkpoints", steps, abstract)
    return layout, dataset, None


def saved_corpus_hash(path: Path) -> str:
    """The corpus's sha256 a run recorded in ``path`` (its ``data.json``); a damaged file raises ``ValueError``
    naming it (a missing one is no record: the resume goes on unchecked, and `begin_run` writes it again)."""
    unchecked = "so the corpus cannot be checked against the run's (remove the file to resume without that check)"
    try:
        record = load_json(path)
    except ValueError as error:
        raise ValueError(f"{error}, {unchecked}") from None
    saved = record.get("sha256") if isinstance(record, dict) else None
    if not isinstance(saved, str):
        raise ValueError(f"{path}: no sha256 of the corpus, {unchecked}")
    return saved


def finished_run(run_dir: Path) -> dict | None:
    """The record of the finished run in ``run_dir``; None when its ``final.json`` is damaged (`finished_record`)
    but checkpoints are there to train the run again from, as a sweep's relaunch does (the file is left as it is
    until the new record replaces it); without checkpoints a damaged file raises ``ValueError`` naming it."""
    try:
        return finished_record(run_dir / "final.json")
    except ValueError as error:
        if not has_checkpoints(run_dir):  # training from the start would replace the run's metrics: the user's call
            raise ValueError(f"{error}; {run_dir} holds no checkpoint to train the run again from (remove final.json "
                             "to train it from the start, or use a new train.run_dir)") from None
        if jax.process_index() == 0:
            print(f"note: {error}; training the run again from its last checkpoint", file=sys.stderr, flush=True)
        return None


def begin_run(config: TrainConfig, run_dir: Path, dataset: Dataset) -> None:
    """The first writes into a checked run directory: the resolved config and the data record (`_write_run_files`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        (run_dir / "error.json").unlink(missing_ok=True)
        _write_run_files(config, run_dir, dataset)


def _write_run_files(config: TrainConfig, run_dir: Path, dataset: Dataset) -> None:
    write_json_atomic(run_dir / "data.json", dataset.info)  # first: the run has begun (`run_began`)
    write_text_atomic(run_dir / "config.yaml", yaml.safe_dump(config_to_dict(config), sort_keys=False))
    if dataset.tokenizer is not None and dataset.tokenizer.name == "bpe":
        dataset.tokenizer.save(run_dir / "tokenizer.json")
        keep_token_metadata(config, run_dir)
