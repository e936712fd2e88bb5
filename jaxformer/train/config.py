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
from pathlib import Path
from typing import Any, Literal

from jaxformer.configs import apply_overrides, from_dict, load_yaml, to_dict
from jaxformer.models.config import DERIVED_FIELDS, ModelConfig
from jaxformer.models.presets import model_config_from_dict

DEFAULT_PRESET = "tiny"
MAX_STEPS = 2**31 - 1  # the step counter is int32


@dataclasses.dataclass(frozen=True)
class MarkovConfig:
    """The ``synthetic-markov`` source: an order-``order`` chain over ``alphabet`` byte values.

    Every context has ``branching`` possible successors with Dirichlet(``concentration``)
    probabilities; ``bytes`` bytes are generated, in independent stationary documents.
    """

    order: int = 1
    alphabet: int = 32
    branching: int = 4
    concentration: float = 1.0
    bytes: int = 2_000_000
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the tokens come from.

    corpus: ``stdlib`` (this Python's standard-library sources), ``files:GLOB[,GLOB…]``,
      ``tokens:PATH`` (a nanoGPT ``.bin`` file, or a directory holding ``train.bin`` and
      ``val.bin``) or ``synthetic-markov`` (parameters in ``data.markov``).
    tokenizer: ``byte`` (vocabulary 256) or ``bpe`` (trained on the training split, saved with the run).
    doc_bytes: text documents longer than this are cut (at a newline) into documents of at most this size.
    val_fraction: share of documents held out for validation, chosen by a hash of their names.
    """

    corpus: str = "stdlib"
    tokenizer: Literal["byte", "bpe"] = "byte"
    bpe_vocab_size: int = 1024
    bpe_train_bytes: int = 4_000_000
    token_dtype: Literal["uint16", "uint32"] = "uint16"
    val_fraction: float = 0.05
    split_seed: int = 0
    doc_bytes: int = 65_536
    markov: MarkovConfig = dataclasses.field(default_factory=MarkovConfig)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm clipping; linear warmup then cosine decay ending at the run's last step.

    lr: peak learning rate. warmup_fraction: share of the run's steps spent warming up from 0.
    final_lr_fraction: the learning rate at the last step, as a fraction of ``lr``.
    grad_clip: maximum global gradient norm (0 turns clipping off). Weight decay skips vectors.
    """

    lr: float = 3e-3
    warmup_fraction: float = 0.05
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """The ``train`` section: budget, batch shape, precision, evaluation.

    tokens: the token budget D. batch_size: sequences per optimizer step, split into
    ``grad_accum`` micro-batches. compute_dtype: ``bfloat16`` computes in bf16 from fp32
    master weights. eval_interval: steps between validation passes (0: only at the end).
    eval_tokens: validation tokens per pass. peak_flops: FLOP/s the MFU is measured against
    (unset: probed with a matmul at start). compilation_cache: JAX's persistent compilation
    cache directory ("" disables it).
    """

    tokens: int = 2_000_000
    batch_size: int = 32
    seq_len: int = 128
    grad_accum: int = 1
    seed: int = 0
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    eval_interval: int = 0
    eval_tokens: int = 65_536
    peak_flops: float | None = None
    run_dir: str | None = None
    compilation_cache: str = "~/.cache/jaxformer/xla"


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints every ``interval`` steps (and at the end), the last ``keep`` kept.

    resume: continue from the run directory's latest readable checkpoint when there is one.
    """

    interval: int = 100
    keep: int = 3
    resume: bool = True


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """Metrics every ``interval`` steps; ``progress``: ``auto`` (a bar on a terminal, else plain lines)."""

    interval: int = 10
    progress: Literal["auto", "bar", "plain", "none"] = "auto"
    tensorboard: bool = True


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device-mesh axis sizes; their product is the device count. -1 (at most one axis): the remaining devices.

    data: pure data parallelism (parameters replicated), the default over every device, as
    DDP. fsdp: data parallelism with parameters and optimizer state sharded (ZeRO-3), for
    models too big to replicate: ``parallel.mesh.data=1 parallel.mesh.fsdp=-1``. tensor:
    attention heads and MLP columns split (Megatron). expert: MoE experts split; it also
    splits the batch, like data. On a CPU the `jaxformer` command makes each core a device
    (`jaxformer.runtime`), so the default trains data-parallel over the cores.
    """

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """Multi-process runs (one process per host or per accelerator) through ``jax.distributed.initialize``.

    initialize: true / false, or null (auto): initialise when a coordinator address or a
      process count is given here or in the environment (``JAX_COORDINATOR_ADDRESS``,
      ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), or under a multi-task SLURM step or Open MPI
      launch. With ``initialize: true`` and nothing else set, JAX detects the rest on Cloud
      TPU, SLURM and Open MPI.
    coordinator_address: ``host:port`` of process 0's coordinator service.
    """

    initialize: bool | None = None
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """How the run is laid out on devices (`jaxformer.parallel`); it never changes the math.

    rules: overrides of the logical-axis → mesh-axis table (`jaxformer.parallel.rules`), e.g.
    ``parallel.rules.embed=null`` (replicate) or ``parallel.rules.mlp=[tensor, fsdp]``.
    """

    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
    rules: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The whole run. ``model`` accepts ``preset: NAME`` plus overrides (default preset ``tiny``)."""

    model: ModelConfig = dataclasses.field(default_factory=lambda: model_config_from_dict({"preset": DEFAULT_PRESET}))
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    train: LoopConfig = dataclasses.field(default_factory=LoopConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)

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


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """A validated `TrainConfig` from a plain mapping (YAML with overrides already applied)."""
    data = dict(data)
    model_data = data.pop("model", None) or {}
    if not isinstance(model_data, dict):
        raise ValueError(f"model must be a mapping of model fields, got {model_data!r}")
    if "preset" not in model_data:
        model_data = {"preset": DEFAULT_PRESET, **model_data}
    config = from_dict(TrainConfig, {**data, "model": model_config_from_dict(model_data)})
    validate(config)
    return config


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """Reads ``path`` (None: all defaults), applies ``key.sub=value`` overrides, validates."""
    data = load_yaml(path) if path is not None else {}
    return config_from_dict(apply_overrides(data, list(overrides)))


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """The fully resolved config; ``config_from_dict`` of it gives ``config`` back."""
    return to_dict(config)


# fields a resumed run may change: they do not alter the parameters or the data stream (the attention
# path and the mesh change only the order of fp32 sums)
RESUMABLE_CHANGES = ("logging.", "checkpoint.", "train.run_dir", "train.compilation_cache", "train.peak_flops",
                     "train.eval_interval", "parallel.", "model.attention_")


def resume_conflict(saved: dict[str, Any], current: TrainConfig) -> str | None:
    """The first field (other than `RESUMABLE_CHANGES`) whose value differs from the run's saved config.

    Fields the model derives from others (``d_ff`` from ``d_model``…) are compared last, so the
    message names the field the user changed.
    """
    before, after = _flatten(saved), _flatten(config_to_dict(current))
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


def validate(config: TrainConfig) -> None:
    """Cross-field and range checks; raises ``ValueError`` naming the first bad field."""
    model, data, opt, train = config.model, config.data, config.optimizer, config.train
    if model.family != "decoder":
        raise ValueError(f"model.family must be decoder for next-token training, got {model.family!r}")
    for name in ("tokens", "batch_size", "seq_len", "grad_accum", "eval_tokens"):
        _positive(f"train.{name}", getattr(train, name))
    _non_negative("train.eval_interval", train.eval_interval)
    if config.total_steps > MAX_STEPS:
        raise ValueError(f"train.tokens={train.tokens:.3g} is {config.total_steps:.3g} optimizer steps of "
                         f"{config.tokens_per_step:,} tokens; at most {MAX_STEPS:,} are supported")
    if train.batch_size % train.grad_accum:
        raise ValueError(
            f"train.batch_size ({train.batch_size}) must be a multiple of train.grad_accum ({train.grad_accum})"
        )
    if train.peak_flops is not None:
        _positive("train.peak_flops", train.peak_flops)
    if train.seq_len > model.max_seq_len:  # every model is limited to its max_seq_len positions
        table = "the learned position table" if model.position == "learned" else "the model's context"
        raise ValueError(f"train.seq_len={train.seq_len} exceeds {table} (model.max_seq_len={model.max_seq_len})")
    _positive("optimizer.lr", opt.lr)
    _in_range("optimizer.warmup_fraction", opt.warmup_fraction, 0.0, 1.0, high_open=True)
    _in_range("optimizer.final_lr_fraction", opt.final_lr_fraction, 0.0, 1.0)
    _non_negative("optimizer.weight_decay", opt.weight_decay)
    _in_range("optimizer.beta1", opt.beta1, 0.0, 1.0, high_open=True)
    _in_range("optimizer.beta2", opt.beta2, 0.0, 1.0, high_open=True)
    _positive("optimizer.eps", opt.eps)
    _non_negative("optimizer.grad_clip", opt.grad_clip)
    _in_range("data.val_fraction", data.val_fraction, 0.0, 1.0, low_open=True, high_open=True)
    _positive("data.doc_bytes", data.doc_bytes)
    _positive("data.bpe_train_bytes", data.bpe_train_bytes)
    if data.tokenizer == "bpe":
        if not 256 < data.bpe_vocab_size <= 65_536:
            raise ValueError(f"data.bpe_vocab_size must be in (256, 65536], got {data.bpe_vocab_size}")
        if model.vocab_size < data.bpe_vocab_size:
            raise ValueError(
                f"model.vocab_size={model.vocab_size} is smaller than data.bpe_vocab_size={data.bpe_vocab_size}"
            )
    elif model.vocab_size < 256 and not data.corpus.startswith("tokens:"):
        raise ValueError(f"model.vocab_size={model.vocab_size} is smaller than the byte vocabulary (256)")
    _validate_corpus_spec(data)
    for name in ("interval", "keep"):
        _positive(f"checkpoint.{name}", getattr(config.checkpoint, name))
    _positive("logging.interval", config.logging.interval)
    _validate_parallel(config.parallel)


def _validate_parallel(parallel: ParallelConfig) -> None:
    """Checks that need no devices; sizes against the devices and the model are checked by `jaxformer.parallel`."""
    axes = dataclasses.asdict(parallel.mesh)
    for name, size in axes.items():
        if size != -1 and size <= 0:
            raise ValueError(f"parallel.mesh.{name} must be positive or -1 (all remaining devices), got {size}")
    if list(axes.values()).count(-1) > 1:
        raise ValueError(f"at most one parallel.mesh axis may be -1, got {axes} "
                         "(data is -1 by default: FSDP over every device is parallel.mesh.data=1 parallel.mesh.fsdp=-1)")
    dist = parallel.distributed
    if dist.num_processes is not None:
        _positive("parallel.distributed.num_processes", dist.num_processes)
    if dist.process_id is not None:
        _non_negative("parallel.distributed.process_id", dist.process_id)
        if dist.num_processes is not None and dist.process_id >= dist.num_processes:
            raise ValueError(f"parallel.distributed.process_id={dist.process_id} must be below "
                             f"parallel.distributed.num_processes={dist.num_processes}")


def _validate_corpus_spec(data: DataConfig) -> None:
    kind, sep, rest = data.corpus.partition(":")
    if kind in ("files", "tokens") and not (sep and rest.strip()):
        raise ValueError(f"data.corpus {data.corpus!r} needs a path after '{kind}:'")
    if kind == "tokens" and data.tokenizer != "byte":
        raise ValueError(f"data.tokenizer must be byte (unused) for a pre-tokenised corpus, got {data.tokenizer!r}")
    if not (data.corpus in ("stdlib", "synthetic-markov") or kind in ("files", "tokens")):
        raise ValueError(
            f"data.corpus must be stdlib, files:GLOB, tokens:PATH or synthetic-markov, got {data.corpus!r}"
        )
    markov = data.markov
    _in_range("data.markov.alphabet", markov.alphabet, 2, 256)
    _in_range("data.markov.branching", markov.branching, 1, markov.alphabet)
    _positive("data.markov.order", markov.order)
    _positive("data.markov.bytes", markov.bytes)
    _positive("data.markov.concentration", markov.concentration)
    if markov.alphabet**markov.order > 1 << 22:
        raise ValueError(
            f"data.markov.order={markov.order} with alphabet {markov.alphabet} has "
            f"{markov.alphabet**markov.order:,} contexts; at most {1 << 22:,} are supported"
        )


def _positive(field: str, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{field} must be positive, got {value!r}")


def _non_negative(field: str, value: float) -> None:
    if value < 0:
        raise ValueError(f"{field} must be >= 0, got {value!r}")


def _in_range(field: str, value: float, low: float, high: float, *, low_open=False, high_open=False) -> None:
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        brackets = ("(" if low_open else "[") + f"{low}, {high}" + (")" if high_open else "]")
        raise ValueError(f"{field} must be in {brackets}, got {value!r}")
