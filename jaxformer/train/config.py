"""The configuration of one training run: a typed tree loaded from YAML plus dotted overrides.

``load_config("experiments/train_tiny.yaml", ["model.d_model=32", "train.tokens=2e6"])``
returns a frozen `TrainConfig` whose every field has been checked; a bad value raises
``ValueError`` with one line naming the dotted field and the value. Units: lengths and
budgets are tokens, intervals are optimizer steps, rates are per second.

How the token budget D maps to steps: one optimizer step consumes
``train.batch_size × train.seq_len`` target tokens (inputs are the same windows shifted by
one), and a run takes ``ceil(D / (batch_size · seq_len))`` steps — never fewer tokens than
asked; the tokens actually trained on (``steps · batch_size · seq_len``) are recorded as D.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, Literal

from jaxformer.configs import (FRACTION, NON_NEGATIVE, POSITIVE, Range, Section, apply_overrides, from_dict, load_yaml,
                               setting, to_dict)
from jaxformer.functional.kernel import KernelConfig
from jaxformer.parallel.config import ParallelConfig
from jaxformer.architecture import DERIVED_FIELDS, ModelConfig
from jaxformer.models.presets import model_config_from_dict

DEFAULT_PRESET = "tiny"
MAX_STEPS = 2**31 - 1  # the step counter is int32


@dataclasses.dataclass(frozen=True)
class MarkovConfig(Section):
    """The ``synthetic-markov`` source: an order-``order`` chain over ``alphabet`` byte values.

    Every context has ``branching`` possible successors with Dirichlet(``concentration``)
    probabilities; ``bytes`` bytes are generated, in independent stationary documents.
    """

    SECTION = "data.markov"

    order: int = setting(1, POSITIVE)
    alphabet: int = setting(32, Range(2, 256))
    branching: int = 4
    concentration: float = setting(1.0, POSITIVE)
    bytes: int = setting(2_000_000, POSITIVE)
    seed: int = 0

    def check(self) -> None:
        Range(1, self.alphabet).check("data.markov.branching", self.branching)
        if self.alphabet**self.order > 1 << 22:
            raise ValueError(f"data.markov.order={self.order} with alphabet {self.alphabet} has "
                             f"{self.alphabet**self.order:,} contexts; at most {1 << 22:,} are supported")


@dataclasses.dataclass(frozen=True)
class DataConfig(Section):
    """Where the tokens come from.

    corpus: ``stdlib`` (this Python's standard-library sources), ``files:GLOB[,GLOB…]``,
      ``tokens:PATH`` (a nanoGPT ``.bin`` file, or a directory holding ``train.bin`` and
      ``val.bin``) or ``synthetic-markov`` (parameters in ``data.markov``).
    tokenizer: ``byte`` (vocabulary 256) or ``bpe`` (trained on the training split, saved with the run).
    doc_bytes: text documents longer than this are cut (at a newline) into documents of at most this size.
    val_fraction: share of documents held out for validation, chosen by a hash of their names.
    """

    SECTION = "data"

    corpus: str = "stdlib"
    tokenizer: Literal["byte", "bpe"] = "byte"
    bpe_vocab_size: int = 1024
    bpe_train_bytes: int = setting(4_000_000, POSITIVE)
    token_dtype: Literal["uint16", "uint32"] = "uint16"
    val_fraction: float = setting(0.05, Range(0.0, 1.0, low_open=True, high_open=True))
    split_seed: int = 0
    doc_bytes: int = setting(65_536, POSITIVE)
    markov: MarkovConfig = dataclasses.field(default_factory=MarkovConfig)

    def check(self) -> None:
        kind, sep, rest = self.corpus.partition(":")
        if kind in ("files", "tokens") and not (sep and rest.strip()):
            raise ValueError(f"data.corpus {self.corpus!r} needs a path after '{kind}:'")
        if kind == "tokens" and self.tokenizer != "byte":
            raise ValueError(f"data.tokenizer must be byte (unused) for a pre-tokenised corpus, got {self.tokenizer!r}")
        if not (self.corpus in ("stdlib", "synthetic-markov") or kind in ("files", "tokens")):
            raise ValueError(
                f"data.corpus must be stdlib, files:GLOB, tokens:PATH or synthetic-markov, got {self.corpus!r}")
        if self.tokenizer == "bpe" and not 256 < self.bpe_vocab_size <= 65_536:
            raise ValueError(f"data.bpe_vocab_size must be in (256, 65536], got {self.bpe_vocab_size}")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(Section):
    """AdamW with global-norm clipping; linear warmup then cosine decay ending at the run's last step.

    lr: peak learning rate. warmup_fraction: share of the run's steps spent warming up from 0.
    final_lr_fraction: the learning rate at the last step, as a fraction of ``lr``.
    grad_clip: maximum global gradient norm (0 turns clipping off). Weight decay skips vectors.
    """

    SECTION = "optimizer"

    lr: float = setting(3e-3, POSITIVE)
    warmup_fraction: float = setting(0.05, Range(0.0, 1.0, high_open=True))
    final_lr_fraction: float = setting(0.1, FRACTION)
    weight_decay: float = setting(0.1, NON_NEGATIVE)
    beta1: float = setting(0.9, Range(0.0, 1.0, high_open=True))
    beta2: float = setting(0.95, Range(0.0, 1.0, high_open=True))
    eps: float = setting(1e-8, POSITIVE)
    grad_clip: float = setting(1.0, NON_NEGATIVE)


@dataclasses.dataclass(frozen=True)
class LoopConfig(Section):
    """The ``train`` section: budget, batch shape, precision, evaluation.

    tokens: the token budget D. batch_size: sequences per optimizer step, split into
    ``grad_accum`` micro-batches. compute_dtype: ``bfloat16`` computes in bf16 from fp32
    master weights. eval_interval: steps between validation passes (0: only at the end).
    eval_tokens: validation tokens per pass. peak_flops: FLOP/s the MFU is measured against
    (unset: probed with a matmul at start). compilation_cache: JAX's persistent compilation
    cache directory ("" disables it).
    """

    SECTION = "train"

    tokens: int = setting(2_000_000, POSITIVE)
    batch_size: int = setting(32, POSITIVE)
    seq_len: int = setting(128, POSITIVE)
    grad_accum: int = setting(1, POSITIVE)
    seed: int = 0
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    eval_interval: int = setting(0, NON_NEGATIVE)
    eval_tokens: int = setting(65_536, POSITIVE)
    peak_flops: float | None = setting(None, POSITIVE)
    run_dir: str | None = None
    compilation_cache: str = "~/.cache/jaxformer/xla"

    def check(self) -> None:
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"train.batch_size ({self.batch_size}) must be a multiple of train.grad_accum ({self.grad_accum})")
        steps = -(-self.tokens // (self.batch_size * self.seq_len))
        if steps > MAX_STEPS:
            raise ValueError(f"train.tokens={self.tokens:.3g} is {steps:.3g} optimizer steps of "
                             f"{self.batch_size * self.seq_len:,} tokens; at most {MAX_STEPS:,} are supported")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(Section):
    """Orbax checkpoints every ``interval`` steps (and at the end), the last ``keep`` kept.

    resume: continue from the run directory's latest readable checkpoint when there is one.
    """

    SECTION = "checkpoint"

    interval: int = setting(100, POSITIVE)
    keep: int = setting(3, POSITIVE)
    resume: bool = True


@dataclasses.dataclass(frozen=True)
class LoggingConfig(Section):
    """Metrics every ``interval`` steps; ``progress``: ``auto`` (a bar on a terminal, else plain lines)."""

    SECTION = "logging"

    interval: int = setting(10, POSITIVE)
    progress: Literal["auto", "bar", "plain", "none"] = "auto"
    tensorboard: bool = True


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
    """The whole run, composed of its subsystems' sections (Levanter's pattern); ``check`` spans them.

    ``model`` accepts ``preset: NAME`` plus overrides (default preset ``tiny``).
    """

    model: ModelConfig = dataclasses.field(default_factory=lambda: model_config_from_dict({"preset": DEFAULT_PRESET}))
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    train: LoopConfig = dataclasses.field(default_factory=LoopConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    kernel: KernelConfig = dataclasses.field(default_factory=KernelConfig)

    def check(self) -> None:
        """What spans sections: the model against the data and the sequence length."""
        model, data, train = self.model, self.data, self.train
        if model.family != "decoder":
            raise ValueError(f"model.family must be decoder for next-token training, got {model.family!r}")
        if train.seq_len > model.max_seq_len:  # every model is limited to its max_seq_len positions
            table = "the learned position table" if model.position == "learned" else "the model's context"
            raise ValueError(f"train.seq_len={train.seq_len} exceeds {table} (model.max_seq_len={model.max_seq_len})")
        if data.tokenizer == "bpe" and model.vocab_size < data.bpe_vocab_size:
            raise ValueError(
                f"model.vocab_size={model.vocab_size} is smaller than data.bpe_vocab_size={data.bpe_vocab_size}")
        if data.tokenizer == "byte" and model.vocab_size < 256 and not data.corpus.startswith("tokens:"):
            raise ValueError(f"model.vocab_size={model.vocab_size} is smaller than the byte vocabulary (256)")

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.train.seq_len

    @property
    def micro_batch(self) -> int:
        """Sequences per micro-batch (``batch_size / grad_accum``), the unit the mesh splits."""
        return self.train.batch_size // self.train.grad_accum

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the run: ``ceil(D / (batch_size · seq_len))``."""
        return -(-self.train.tokens // self.tokens_per_step)


class ConfigDeprecation(UserWarning):
    """A key that moved: still accepted, with a one-line note saying where it lives now."""


# keys that moved: old dotted key -> new dotted key (None: no longer used, ignored)
MOVED_KEYS = {
    "model.attention_impl": "kernel.attention_impl",
    "model.attention_block_size": "kernel.attention_block_size",
    "model.attention_query_block_size": "kernel.attention_query_block_size",
    "model.attention_query_blocks": None,  # before kernel.attention_query_block_size
}


def migrate(data: dict[str, Any], *, note: bool = True) -> dict[str, Any]:
    """``data`` with `MOVED_KEYS` moved to their new place (a new key given too wins); one note per key."""
    data = {key: dict(value) if isinstance(value, dict) else value for key, value in data.items()}
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".")
        if not isinstance(data.get(section), dict) or key not in data[section]:
            continue
        value = data[section].pop(key)
        if new is not None:
            new_section, new_key = new.split(".")
            target = data.setdefault(new_section, {})
            if isinstance(target, dict):
                target.setdefault(new_key, value)
        if note:
            warnings.warn(f"{old} is deprecated: " + (f"use {new}" if new else "it is no longer used (ignored)"),
                          ConfigDeprecation, stacklevel=2)
    return data


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """A validated `TrainConfig` from a plain mapping (YAML with overrides already applied)."""
    data = migrate(data)
    model_data = data.pop("model", None) or {}
    if not isinstance(model_data, dict):
        raise ValueError(f"model must be a mapping of model fields, got {model_data!r}")
    if "preset" not in model_data:
        model_data = {"preset": DEFAULT_PRESET, **model_data}
    return from_dict(TrainConfig, {**data, "model": model_config_from_dict(model_data)})


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """Reads ``path`` (None: all defaults), applies ``key.sub=value`` overrides, validates."""
    data = load_yaml(path) if path is not None else {}
    return config_from_dict(apply_overrides(data, list(overrides)))


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """The fully resolved config; ``config_from_dict`` of it gives ``config`` back."""
    return to_dict(config)


# sections and fields a resumed run may change: they do not alter the parameters or the data stream (the
# kernel and the mesh change only the order of fp32 sums)
RESUMABLE_CHANGES = ("logging.", "checkpoint.", "train.run_dir", "train.compilation_cache", "train.peak_flops",
                     "train.eval_interval", "parallel.", "kernel.")


def resume_conflict(saved: dict[str, Any], current: TrainConfig) -> str | None:
    """The first field (other than `RESUMABLE_CHANGES`) whose value differs from the run's saved config.

    Fields the model derives from others (``d_ff`` from ``d_model``…) are compared last, so the
    message names the field the user changed.
    """
    before, after = _flatten(migrate(saved, note=False)), _flatten(config_to_dict(current))
    derived = {f"model.{name}" for name in DERIVED_FIELDS}
    for key in sorted(before.keys() | after.keys(), key=lambda key: (key in derived, key)):
        if not key.startswith(RESUMABLE_CHANGES) and before.get(key) != after.get(key):
            return f"{key} was {before.get(key)!r} in the saved run, now {after.get(key)!r}"
    return None


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
