"""The planner: a sweep spec → the list of runs, each with an exact N, D, C and a full training config."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from jaxformer.accounting import count_params, training_flops_per_token
from jaxformer.configs import set_dotted, to_dict
from jaxformer.architecture import ModelConfig
from jaxformer.sweep.sizing import ShapeRule, shape_for_params
from jaxformer.sweep.spec import SweepSpec, evaluate_formula
from jaxformer.train.config import TrainConfig, config_from_dict
from jaxformer.train.optimizer_config import cooldown_steps, warmup_steps

SHAPE_FIELDS = ("num_layers", "d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "expert_d_ff")


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One training run of the sweep.

    N: exact total parameters of the shaped model (embeddings and head included).
    D: tokens it trains on (whole optimizer steps of batch_size × seq_len).
    C: training FLOPs of those tokens under the spec's ``flops`` rule (``flops_rule``), the run's
       recorded ``flops_exact`` or ``flops_6nd``; C_exact and C_6nd: both counts
       (`jaxformer.accounting.training_flops_per_token`: exact, or ``6·N_active·D``).
    budget: the IsoFLOP budget it belongs to (None for a grid).
    trunk, fork_step: a branch's trunk and the step it forks from (`jaxformer.sweep.branches`); None otherwise.
    """

    name: str
    N: int
    N_non_embedding: int
    D: int
    C: float
    C_exact: float
    C_6nd: float
    flops_rule: str
    budget: float | None
    target_params: float
    steps: int
    seed: int
    config: dict[str, Any]
    trunk: str | None = None
    fork_step: int | None = None

    @property
    def tokens_per_param(self) -> float:
        return self.D / self.N


def _short(value: float) -> str:
    return f"{value:.3g}".replace("+", "")


def _run_config(spec: SweepSpec, model: ModelConfig, tokens: float, seed: int, variables: dict) -> TrainConfig:
    """The base config with this run's shape, formulas, budget and seed, validated."""
    data = copy.deepcopy(spec.base)
    model_fields = to_dict(model)
    for field in SHAPE_FIELDS:
        set_dotted(data, f"model.{field}", model_fields[field])
    for key, formula in spec.hyperparameters.items():
        set_dotted(data, key, evaluate_formula(key, formula, variables))
    set_dotted(data, "train.tokens", int(tokens))
    set_dotted(data, "train.seed", seed)
    return config_from_dict(data)


def plan_run(spec: SweepSpec, budget_or_tokens: float, target: float, seed: int, *, rule: str,
             isoflop: bool | None = None, shape: ShapeRule | None = None, prefix: str = "") -> PlannedRun:
    """One run: the model ``spec.shape`` (or ``shape``) gives for ``target`` parameters, trained on the
    tokens of a budget of C FLOPs under ``rule`` (``isoflop``, by default when the sweep is an IsoFLOP
    one) or on that many tokens (a grid's), with this seed; its name starts with ``prefix``.

    Raises ``ValueError`` naming the budget and size when the run would take no optimizer step.
    """
    base = config_from_dict(dict(spec.base))
    model = shape_for_params(target, base.model, shape or spec.shape)
    params = count_params(model)
    isoflop = spec.isoflop is not None if isoflop is None else isoflop
    seq_len = base.train.seq_len
    for _ in range(2):  # a formula may set train.seq_len: a budget's tokens follow from the run's own FLOPs per token
        per_token = training_flops_per_token(model, seq_len, rule)
        wanted = budget_or_tokens / per_token if isoflop else budget_or_tokens
        variables = {"N": params.total, "D": wanted, "C": wanted * per_token, "d_model": model.d_model,
                     "num_layers": model.num_layers, "seed": seed}
        # the tokens of one step (formulas may set its batch), from a config of at least one token: under one step
        # the check below names the budget
        probe = _run_config(spec, model, max(wanted, 1), seed, variables)
        if probe.train.seq_len == seq_len:
            break
        seq_len = probe.train.seq_len
    step = probe.tokens_per_step
    steps = round(wanted / step)
    if steps < 1:
        what = f"budget C={budget_or_tokens:.3g}" if isoflop else f"tokens D={budget_or_tokens:.3g}"
        raise ValueError(
            f"{what} is too small for params={target:.3g} (N={params.total:,}): {wanted:,.0f} tokens "
            f"is less than one step of {step:,} tokens"
        )
    tokens = steps * step
    config = _run_config(spec, model, tokens, seed, variables)
    _check_shaped(spec, model, config, target)
    budget = budget_or_tokens if isoflop else None
    name = prefix + (f"C{_short(budget_or_tokens)}-N{params.total}" if isoflop
                     else f"N{params.total}-D{_short(tokens)}") + f"-s{seed}"
    counts = {r: tokens * training_flops_per_token(model, config.train.seq_len, r) for r in ("exact", "6ND")}
    return PlannedRun(
        name=name, N=params.total, N_non_embedding=params.non_embedding, D=tokens, C=counts[rule],
        C_exact=counts["exact"], C_6nd=counts["6ND"], flops_rule=rule, budget=budget,
        target_params=target, steps=config.total_steps, seed=seed, config=to_dict(config),
    )


def _check_shaped(spec: SweepSpec, model: ModelConfig, config: TrainConfig, target: float) -> None:
    """Refuses hyperparameters that change the model the size rule shaped (its count or FLOPs per token): the run's
    N, D and C are that model's, so it must be the one that trains."""
    seq_len, shaped, trained = config.train.seq_len, count_params(model), count_params(config.model)
    if (trained == shaped
            and training_flops_per_token(config.model, seq_len, "exact") == training_flops_per_token(model, seq_len,
                                                                                                     "exact")):
        return
    keys = [key for key in spec.hyperparameters if key.startswith("model.")] or list(spec.hyperparameters)
    raise ValueError(f"hyperparameters.{keys[0]}: changes the model the size rule shaped for params={target:.3g} "
                     f"(N {shaped.total:,}, trained {trained.total:,}), whose N, D and C the sweep plans with; the "
                     "size rule sets layers and widths (shape:), other architecture goes in base.model")


def plan_runs(spec: SweepSpec) -> list[PlannedRun]:
    """Every run of the sweep, in launch order (budgets ascending, then sizes, then seeds); with ``branches``,
    as branches of their trunks (`fork_runs`)."""
    rule = spec.flops_rule
    runs: list[PlannedRun] = []
    for budget_or_tokens in sorted(spec.isoflop.budgets if spec.isoflop else spec.grid.tokens):
        targets = spec.isoflop.targets(budget_or_tokens) if spec.isoflop else spec.grid.params
        seeds = spec.seeds + (spec.isoflop.extra_seeds(budget_or_tokens) if spec.isoflop else [])
        runs += [plan_run(spec, budget_or_tokens, target, seed, rule=rule) for target in targets for seed in seeds]
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        duplicate = next(name for name in names if names.count(name) > 1)
        raise ValueError(f"two runs of the sweep have the same shape and budget ({duplicate}): {_repeated(spec)}")
    if not spec.branches:
        return runs
    branches = fork_runs(runs)
    if spec.isoflop and spec.isoflop.fill:
        branches = sorted(branches + fill_runs(spec, branches), key=lambda run: (run.budget, run.N, run.seed))
    return branches


def _repeated(spec: SweepSpec) -> str:
    """Why two planned runs share a name: a value the spec lists twice, else the size rule."""
    repeat = spec.isoflop.repeat.seeds if spec.isoflop and spec.isoflop.repeat else []
    lists = {"seeds": spec.seeds, "isoflop.repeat.seeds (with seeds)": spec.seeds + repeat,
             "isoflop.budgets": spec.isoflop.budgets if spec.isoflop else [],
             "isoflop.params": spec.isoflop.params if spec.isoflop else [],
             "grid.params": spec.grid.params if spec.grid else [], "grid.tokens": spec.grid.tokens if spec.grid else []}
    for field, values in lists.items():
        twice = next((value for value in values if values.count(value) > 1), None)
        if twice is not None:
            return f"{field} lists {twice:g} twice"
    return "the size rule mapped two targets to one model (list sizes further apart, or change shape)"


def fill_runs(spec: SweepSpec, branches: list[PlannedRun]) -> list[PlannedRun]:
    """The cooldowns ``isoflop.fill`` adds: each trunk among ``branches`` also cools down at every budget it
    has no branch at, wherever that branch is no longer than its trunk's longest (so the trunk trains no
    further) and its cooldown starts after the warmup. Each is a run of its budget like any other.

    Such a cooldown costs only its last ``cooldown_fraction`` of steps, and it gives the parametric law
    more tokens per size and the budget's curve more sizes.
    """
    trunks: dict[str, list[PlannedRun]] = {}
    for run in branches:
        trunks.setdefault(run.trunk, []).append(run)
    filled = []
    for name, runs in trunks.items():
        first, longest = runs[0], max(run.D for run in runs)
        for budget in sorted(set(spec.isoflop.budgets) - {run.budget for run in runs}):
            run = plan_run(spec, budget, first.target_params, first.seed, rule=spec.flops_rule)
            fork, warmup = _fork_and_warmup(config_from_dict(run.config))
            if run.D <= longest and fork >= max(warmup, 1):
                filled.append(dataclasses.replace(run, trunk=name, fork_step=fork))
    return filled


def fork_step(config: TrainConfig) -> int:
    """F: the updates a branch of ``config``'s length shares with its trunk (see the module docstring)."""
    return config.total_steps - cooldown_steps(config.optimizer, config.total_steps) - 1


def fork_runs(runs: list[PlannedRun]) -> list[PlannedRun]:
    """The planned runs as branches, each with its trunk's name (``trunk-N<N>-s<seed>``) and its fork step.

    Raises ``ValueError`` naming a run that is not WSD with a warmup in tokens, or whose
    cooldown would start inside its warmup.
    """
    names: dict[str, str] = {}  # trunk key -> name
    branches = []
    for run in runs:
        config = config_from_dict(run.config)
        if config.optimizer.schedule != "wsd" or config.optimizer.warmup_tokens is None:
            raise ValueError(f"branches: run {run.name} trains with optimizer.schedule={config.optimizer.schedule}, "
                             f"warmup_tokens={config.optimizer.warmup_tokens}; branches need wsd and warmup_tokens")
        fork, warmup = _fork_and_warmup(config)
        if fork < max(warmup, 1):
            raise ValueError(f"branches: run {run.name}'s cooldown starts at update {fork + 1} of "
                             f"{config.total_steps}, before its warmup of {warmup} ends; lower "
                             "optimizer.warmup_tokens or train longer")
        name = names.setdefault(_trunk_key(run.config), f"trunk-N{run.N}-s{run.seed}")
        branches.append(dataclasses.replace(run, trunk=name, fork_step=fork))
    if len(set(names.values())) != len(names):
        raise ValueError("branches: two trunks would share a name: the size rule maps two targets to two shapes "
                         "of one N; change shape or the sizes")
    return branches


def _fork_and_warmup(config: TrainConfig) -> tuple[int, int]:
    """A branch's fork step (`fork_step`) and its warmup in updates: the cooldown must start after the warmup."""
    return fork_step(config), warmup_steps(config.optimizer, config.total_steps, config.tokens_per_step)


def _trunk_key(config: dict) -> str:
    """What the branches of one trunk share: the whole config but ``train.tokens``."""
    shared = copy.deepcopy(config)
    del shared["train"]["tokens"]
    return json.dumps(shared, sort_keys=True)


def repeated_data_note(runs: list[PlannedRun]) -> str | None:
    """A line saying which runs would see their training data more than once, or None.

    Byte-level text corpora are sized in bytes (one token each) and token corpora in tokens;
    a BPE corpus is not tokenised here (that is each run's work), so it gets no note.
    """
    from jaxformer.train.corpora import TextCorpus, load_corpus

    config = config_from_dict(max(runs, key=lambda run: run.D).config)
    if config.data.tokenizer != "byte":
        return None
    corpus = load_corpus(config.data)
    if isinstance(corpus, TextCorpus):
        train_tokens = (1 - config.data.val_fraction) * sum(len(text) for _, text in corpus.documents)
    else:
        train_tokens = len(corpus.train)
    repeating = [run for run in runs if run.D > train_tokens]
    if not repeating:
        return None
    worst = max(repeating, key=lambda run: run.D)
    return (f"note: {len(repeating)} of {len(runs)} runs see the training split (about {train_tokens:.3g} tokens) "
            f"more than once, up to {worst.D / train_tokens:.1f} epochs ({worst.name}); results record each run's epochs")

