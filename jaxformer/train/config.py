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

from jaxformer.configs import NON_NEGATIVE, POSITIVE, Section, apply_overrides, from_dict, load_yaml, setting, to_dict
from jaxformer.architecture import DERIVED_FIELDS, ModelConfig, check_context
from jaxformer.kernel import KernelConfig
from jaxformer.parallel.config import ParallelConfig
from jaxformer.models.presets import model_config_from_dict
from jaxformer.train.checkpoint_config import CheckpointConfig
from jaxformer.train.corpora import DataConfig
from jaxformer.train.metrics import LoggingConfig
from jaxformer.train.optimizer_config import OptimizerConfig

DEFAULT_PRESET = "tiny"
MAX_STEPS = 2**31 - 1  # the step counter is int32


@dataclasses.dataclass(frozen=True)
class LoopConfig(Section):
    """The ``train`` section: budget, batch shape, precision, evaluation.

    tokens: the token budget D. batch_size: sequences per optimizer step, split into
    ``grad_accum`` micro-batches. compute_dtype: ``bfloat16`` computes in bf16 from fp32
    master weights. eval_interval: steps between validation passes (0: only at the end).
    eval_tokens: validation tokens per pass. peak_flops: FLOP/s the MFU is measured against
    (unset: probed with a matmul at start). compilation_cache: JAX's persistent compilation
    cache directory ("" disables it); it is JAX's setting for the whole process (one cache a process), so
    ``train`` called as a library turns it on for its caller too, unless given "".
    """

    SECTION = "train"

    tokens: int = setting(2_000_000, POSITIVE)
    batch_size: int = setting(32, POSITIVE)
    seq_len: int = setting(128, POSITIVE)
    grad_accum: int = setting(1, POSITIVE)
    seed: int = setting(0, NON_NEGATIVE)  # numpy's and JAX's generators take no negative seed
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
        check_context(model, train.seq_len, what="train.seq_len")
        if data.tokenizer == "bpe" and not model.init_from and model.vocab_size < data.bpe_vocab_size:
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
    if model_data.get("init_from"):  # fine-tuning: the checkpoint's architecture, then the other model keys
        if "preset" in model_data:
            raise ValueError("give model.init_from or model.preset, not both")
        from jaxformer.hf import read_config  # lazily: only runs that start from a checkpoint read one

        base = dataclasses.asdict(read_config(str(model_data["init_from"])))
        model_data = {**base, **model_data}
    elif "preset" not in model_data:
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
RESUMABLE_CHANGES = ("logging.", "checkpoint.", "train.run_dir", "train.compilation_cache", "data.token_cache",
                     "train.peak_flops", "train.eval_interval", "parallel.", "kernel.")


def resume_conflict(saved: dict[str, Any], current: TrainConfig) -> str | None:
    """The first field (other than `RESUMABLE_CHANGES`) whose value differs from the run's saved config.

    Fields the model derives from others (``d_ff`` from ``d_model``…) are compared last, so the
    message names the field the user changed.
    """
    before, after = flatten_dotted(migrate(saved, note=False)), flatten_dotted(config_to_dict(current))
    # a field added since the run was saved reads as its default (the value the run trained with)
    before = {**{key: value for key, value in flatten_dotted(config_to_dict(TrainConfig())).items() if key not in before},
              **before}
    derived = {f"model.{name}" for name in DERIVED_FIELDS}
    for key in sorted(before.keys() | after.keys(), key=lambda key: (key in derived, key)):
        if not key.startswith(RESUMABLE_CHANGES) and before.get(key) != after.get(key):
            return f"{key} was {before.get(key)!r} in the saved run, now {after.get(key)!r}"
    return None


def flatten_dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
