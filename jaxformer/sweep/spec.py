"""The sweep specification: a base training config, a size rule, and a grid or IsoFLOP budgets.

```yaml
name: quick
base: {model: {preset: tiny}, data: {corpus: stdlib}, train: {batch_size: 8, seq_len: 128}}
shape: {head_dim: 16, aspect_ratio: 16}          # target N -> layers/width (sizing.py)
isoflop: {budgets: [1e11, 3e11, 1e12], params: [8e3, 16e3, 32e3, 64e3, 128e3]}   # flops: exact (default) | 6ND
# or sizes centred per budget on a prior N_opt, widened where a minimum lies at an edge (adapt.py):
#   isoflop: {budgets: [...], center: {n_opt: 2.5e4, budget: 3e11, span: 5, sizes: 5}, adapt: true, adapt_limit: 2}
# or: grid: {params: [...], tokens: [...]}
hyperparameters:                                  # formulas of N, D, C, d_model, num_layers, seed (formula.py)
  optimizer.lr: "min(1e-2, 3e-3 * (N / 1e5) ** -0.3)"
seeds: [0]
fit: {approaches: [2, 3]}
verify: {factor: 3}                               # a held-out compute-optimal run after the fit (verify.py)
# or, instead of a hand-written optimizer.lr, a tuning stage first (tune.py): a learning-rate grid at a few
# sizes on a small budget (FLOPs each), whose fitted rule lr = c · (N / N0)^k the runs then train with
tune: {budget: 3e10, params: [1e4, 3e4, 1e5], lr: [1e-3, 3e-3, 1e-2, 3e-2]}   # optional beta2: [...], batch_size: [...]
branches: true    # base optimizer {schedule: wsd, warmup_tokens: ...}: one stable-lr trunk per model, each run a
                  # cooldown forked from its checkpoint (branches.py); hyperparameters then may not use D or C;
                  # isoflop.fill: true then adds a cooldown at every other budget a trunk reaches (plan.py)
together: true    # runs differing only in the lr schedule and seed (a tuning size's rates, a budget's seeds) train
                  # as one program in one worker request (jaxformer.train.together); default false
```

``together`` is off by default: a group's Y runs take one worker, so it pays only where the
stacked step beats Y lone steps (`jaxformer bench together` measures a shape; docs/sweep-speed.md)
and there are at least as many groups as workers — else cores that would train other runs sit idle.

IsoFLOP runs take ``D = C / (3·F)`` with F the exact forward FLOPs per token, attention and
the output head included (``flops: exact``, the default), or ``D = C / (6·N)`` (``flops: 6ND``),
N being the exact count of the shaped model's active parameters (all of them unless it is a
mixture of experts), as `jaxformer.accounting.training_flops_per_token` counts them for the
run's ``flops_exact`` / ``flops_6nd``. Small models' exact count is well above 6ND, by a factor
that changes with size, so 6ND budgets tilt every IsoFLOP curve.

With ``adapt: true`` (centred sizes only), a budget whose minimum lies at an edge of its sizes, as
Approach 2 decides it, gets one more size beyond that edge, continuing its log-spacing; it trains
after the planned runs and is appended to plan.json, and so on until the minimum is bracketed or
the budget has added ``adapt_limit`` sizes (`jaxformer.sweep.adapt`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Literal

from jaxformer.configs import from_dict, load_yaml
from jaxformer.sweep.formula import FormulaError
from jaxformer.sweep.formula import check as check_formula
from jaxformer.sweep.formula import evaluate as formula_evaluate
from jaxformer.sweep.planned_fields import check_planned_fields
from jaxformer.sweep.sizing import ShapeRule
from jaxformer.train.config import config_from_dict


@dataclasses.dataclass(frozen=True)
class CenterSpec:
    """Sizes centred per budget on a prior estimate of the compute-optimal size.

    N_opt(C) = n_opt · (C / budget)^exponent; each budget gets ``sizes`` targets spaced evenly
    in log N over a factor ``span`` (largest / smallest) around its N_opt.
    """

    n_opt: float
    budget: float
    exponent: float = 0.5
    span: float = 8.0
    sizes: int = 5

    @property
    def step(self) -> float:
        """The ratio of neighbouring target sizes, span^(1/(sizes−1)) (two sizes or more)."""
        return self.span ** (1 / (self.sizes - 1))

    def targets(self, budget: float) -> list[float]:
        """The target sizes N of one budget C."""
        center = self.n_opt * (budget / self.budget) ** self.exponent
        if self.sizes == 1:
            return [center]
        return [center * self.span ** (i / (self.sizes - 1) - 0.5) for i in range(self.sizes)]


@dataclasses.dataclass(frozen=True)
class RepeatSpec:
    """More seeds at one budget (the one the seed noise is measured at): its runs also train with ``seeds``."""

    budget: float
    seeds: list[int] = dataclasses.field(default_factory=lambda: [1])


@dataclasses.dataclass(frozen=True)
class IsoFlopSpec:
    """Compute budgets C (FLOPs) × target sizes N; D follows from C under the ``flops`` rule (exact by default).

    The sizes are one list for every budget (``params``) or centred per budget (``center``); with
    ``adapt``, a budget whose minimum lies at an edge adds sizes beyond it, ``adapt_limit`` at most
    (`jaxformer.sweep.adapt`). With ``fill`` (and ``branches: true``), each WSD trunk also cools down at
    every other budget it reaches (`jaxformer.sweep.plan.fill_runs`).
    """

    budgets: list[float]
    params: list[float] = dataclasses.field(default_factory=list)
    flops: Literal["6ND", "exact"] = "exact"
    center: CenterSpec | None = None
    repeat: RepeatSpec | None = None
    adapt: bool = False
    adapt_limit: int = 2
    fill: bool = False

    def targets(self, budget: float) -> list[float]:
        return self.center.targets(budget) if self.center else list(self.params)

    def extra_seeds(self, budget: float) -> list[int]:
        """Seeds this budget trains with besides the sweep's own."""
        return list(self.repeat.seeds) if self.repeat and math.isclose(budget, self.repeat.budget) else []


@dataclasses.dataclass(frozen=True)
class GridSpec:
    """Target sizes N × token budgets D; C is counted under the ``flops`` rule (exact by default)."""

    params: list[float]
    tokens: list[float]
    flops: Literal["6ND", "exact"] = "exact"


# the planned-run fields (and results-table columns) that can label bootstrap groups
GROUP_FIELDS = ("N", "N_non_embedding", "seed", "budget")


@dataclasses.dataclass(frozen=True)
class FitSpec:
    """What to fit when the sweep ends (Chinchilla approaches), on which counts.

    params: N as ``total`` or ``non_embedding`` parameters; flops: C as ``exact`` or ``6ND``
    training FLOPs (unset: the rule the sweep planned its budgets with); approach2_resample:
    what Approach 2's bootstrap draws, ``runs``, ``residuals`` or ``wild`` (`jaxformer.scaling.isoflop`);
    bootstrap_groups: planned-run fields whose values together make Approach 3's bootstrap draw groups of runs
    instead of single runs (``[N, seed]``: the branches of one WSD trunk, which share its stable phase), and
    Approach 2's ``wild`` bootstrap draw one sign per group.
    """

    approaches: list[int] = dataclasses.field(default_factory=lambda: [2, 3])
    bootstrap: int = 0
    approach2_resample: Literal["runs", "residuals", "wild"] = "runs"
    params: Literal["total", "non_embedding"] = "total"
    flops: Literal["exact", "6ND"] | None = None
    bootstrap_groups: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.approaches or len(set(self.approaches)) < len(self.approaches) \
                or not all(approach in (1, 2, 3) for approach in self.approaches):
            raise ValueError(f"fit.approaches must list distinct approaches of 1, 2 and 3, got {self.approaches}")
        if self.bootstrap < 0 or self.bootstrap == 1:
            raise ValueError(f"fit.bootstrap must be 0 (no intervals) or at least 2 resamples, got {self.bootstrap}")
        for field in self.bootstrap_groups:
            if field not in GROUP_FIELDS:
                raise ValueError(f"fit.bootstrap_groups: {field!r} is not one of {', '.join(GROUP_FIELDS)}")


@dataclasses.dataclass(frozen=True)
class VerifySpec:
    """A held-out compute-optimal run, trained after the fit to test what the law predicts.

    Its budget is ``budget`` FLOPs (counted as the fit counts them), else ``factor`` × the sweep's
    largest; its size is the fitted ``approach``'s N_opt there, shaped by the sweep's rule; the loss it
    should reach and the interval are Approach 3's (so the fit must include Approach 3). ``sizes``:
    multiples of N_opt to train, e.g. ``[0.5, 1, 2]`` for neighbours whose losses locate the optimum.
    ``seeds``: each size trains once per seed (None: the sweep's ``seeds``), and the mean of their losses
    is what the law, fitted on those seeds, predicts.
    """

    factor: float = 3.0
    budget: float | None = None
    approach: int = 3
    seeds: list[int] | None = None
    sizes: list[float] = dataclasses.field(default_factory=lambda: [1.0])


@dataclasses.dataclass(frozen=True)
class TuneSpec:
    """A tuning stage before the sweep (`jaxformer.sweep.tune`): every peak learning rate of ``lr`` (and each
    ``beta2`` and ``batch_size`` listed, in every combination) trained at each target size of ``params``
    on ``budget`` training FLOPs (counted under the sweep's ``flops`` rule) with ``seed``.

    Each size's best learning rate gives the rule lr = c · (N / N0)^k the sweep's runs train with.
    Listed ``beta2`` and ``batch_size`` are chosen once for all sizes (the lowest mean over sizes of
    each size's best loss), applied to the sweep's runs, and the rule is fitted on that pair's runs;
    each size's own best pair is recorded beside it.
    """

    budget: float
    params: list[float]
    lr: list[float]
    beta2: list[float] = dataclasses.field(default_factory=list)
    batch_size: list[int] = dataclasses.field(default_factory=list)
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.budget) and self.budget > 0):
            raise ValueError(f"tune.budget must be a positive number of FLOPs, got {self.budget}")
        if len(set(self.params)) < 2 or not all(math.isfinite(n) and n > 0 for n in self.params):
            raise ValueError(f"tune.params must list two or more distinct positive sizes, got {self.params}")
        if len(set(self.lr)) < 3 or not all(math.isfinite(lr) and lr > 0 for lr in self.lr):
            raise ValueError(f"tune.lr must list three or more distinct positive learning rates, got {self.lr}")
        if len(set(self.beta2)) != len(self.beta2) or not all(0 <= b < 1 for b in self.beta2):
            raise ValueError(f"tune.beta2 must list distinct numbers in [0, 1), got {self.beta2}")
        if len(set(self.batch_size)) != len(self.batch_size) or not all(b > 0 for b in self.batch_size):
            raise ValueError(f"tune.batch_size must list distinct positive integers, got {self.batch_size}")


NAME = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}"  # a sweep's name: the default output directory is runs/NAME


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    name: str
    base: dict[str, Any] = dataclasses.field(default_factory=dict)
    shape: ShapeRule = dataclasses.field(default_factory=ShapeRule)
    isoflop: IsoFlopSpec | None = None
    grid: GridSpec | None = None
    hyperparameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0])
    fit: FitSpec | None = None
    verify: VerifySpec | None = None
    tune: TuneSpec | None = None
    branches: bool = False
    together: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and re.fullmatch(NAME, self.name)):
            raise ValueError(f"name must be a plain name of letters, digits, '.', '_' and '-' (the default "
                             f"output directory is runs/NAME), got {self.name!r}")
        if (self.isoflop is None) == (self.grid is None):
            raise ValueError("a sweep needs exactly one of 'isoflop' or 'grid'")
        values = {"isoflop.budgets": self.isoflop.budgets if self.isoflop else [],
                  "isoflop.params": self.isoflop.params if self.isoflop else [],
                  "grid.params": self.grid.params if self.grid else [],
                  "grid.tokens": self.grid.tokens if self.grid else []}
        for field, numbers in values.items():
            for number in numbers:
                if not math.isfinite(number) or number <= 0:
                    raise ValueError(f"{field} must hold positive numbers, got {number}")
        if self.isoflop and bool(self.isoflop.params) == (self.isoflop.center is not None):
            raise ValueError("isoflop needs exactly one of params (a list of sizes) or center (sizes per budget)")
        center = self.isoflop.center if self.isoflop else None
        if center is not None:
            for field in ("n_opt", "budget", "span"):
                if not math.isfinite(getattr(center, field)) or getattr(center, field) <= 0:
                    raise ValueError(f"isoflop.center.{field} must be positive, got {getattr(center, field)}")
            if center.sizes < 1:
                raise ValueError(f"isoflop.center.sizes must be positive, got {center.sizes}")
        if self.isoflop is not None:
            self._check_adapt(self.isoflop)
        if (self.isoflop and not self.isoflop.budgets) or (self.grid and not (self.grid.params and self.grid.tokens)):
            raise ValueError("the sweep's size and budget lists must not be empty")
        if not self.seeds:
            raise ValueError("seeds must list at least one seed")
        for field, seeds in self._seeds().items():
            if any(seed < 0 for seed in (seeds if isinstance(seeds, list) else [seeds])):
                raise ValueError(f"{field} must be non-negative (each run's train.seed), got {seeds}")
        if self.isoflop and self.fit and self.fit.flops not in (None, self.isoflop.flops):
            raise ValueError(f"fit.flops must be isoflop.flops ({self.isoflop.flops!r}) or unset, got "
                             f"{self.fit.flops!r}: the runs of one IsoFLOP budget share its compute only as the "
                             "sweep counted it")
        repeat = self.isoflop.repeat if self.isoflop else None
        if repeat is not None and not any(math.isclose(repeat.budget, b) for b in self.isoflop.budgets):
            raise ValueError(f"isoflop.repeat.budget must be one of isoflop.budgets, got {repeat.budget:g}")
        if self.verify is not None:
            self._check_verify(self.verify)
        if self.isoflop and self.isoflop.fill and not self.branches:
            raise ValueError("isoflop.fill needs branches: true (it adds cooldowns to the sweep's WSD trunks)")
        groups = self.fit.bootstrap_groups if self.fit else []
        if groups and all(len(values) < 2 for field, values in self._labels().items() if field in groups):
            raise ValueError(f"fit.bootstrap_groups: every run of this sweep has the same {', '.join(groups)}, so the "
                             "runs are one group and every resample would be all of them (zero-width intervals)")

    def _labels(self) -> dict[str, set]:
        """The values each bootstrap-group field takes over the sweep's runs, where the spec alone fixes them."""
        budgets = set(self.isoflop.budgets) if self.isoflop else {None}  # a grid's runs have no budget
        sizes = {n for b in budgets for n in self.isoflop.targets(b)} if self.isoflop else set(self.grid.params)
        seeds = set(self.seeds) | set(self.isoflop.repeat.seeds if self.isoflop and self.isoflop.repeat else [])
        return {"budget": budgets, "seed": seeds, "N": sizes, "N_non_embedding": sizes}

    def _seeds(self) -> dict[str, list[int] | int]:
        """Every seed the spec lists, by the field that lists it."""
        repeat = self.isoflop.repeat if self.isoflop else None
        return {"seeds": self.seeds, "isoflop.repeat.seeds": repeat.seeds if repeat else [],
                "verify.seeds": (self.verify.seeds or []) if self.verify else [],
                "tune.seed": self.tune.seed if self.tune else 0}

    @staticmethod
    def _check_adapt(isoflop: IsoFlopSpec) -> None:
        if isoflop.adapt_limit < 1:
            raise ValueError(f"isoflop.adapt_limit must be positive, got {isoflop.adapt_limit}")
        if not isoflop.adapt:
            return
        if isoflop.center is None:
            raise ValueError("isoflop.adapt needs isoflop.center (sizes centred per budget, evenly spaced in log N)")
        if isoflop.center.sizes < 3:
            raise ValueError(f"isoflop.adapt needs isoflop.center.sizes of 3 or more (a parabola), "
                             f"got {isoflop.center.sizes}")
        if isoflop.center.span <= 1:
            raise ValueError(f"isoflop.adapt needs isoflop.center.span above 1, got {isoflop.center.span}")

    @property
    def flops_rule(self) -> str:
        """How the sweep counts a run's compute: ``exact`` or ``6ND`` (its isoflop or grid section's ``flops``)."""
        return self.isoflop.flops if self.isoflop else self.grid.flops

    def _check_verify(self, verify: VerifySpec) -> None:
        if self.fit is None or 3 not in self.fit.approaches:
            raise ValueError("verify needs a fit with Approach 3 (fit.approaches), whose law predicts the loss")
        if verify.approach not in self.fit.approaches or verify.approach == 1:
            raise ValueError(f"verify.approach must be 2 or 3 and among fit.approaches, got {verify.approach}")
        for field in ("factor", "budget"):
            value = getattr(verify, field)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"verify.{field} must be positive, got {value}")
        if 1 not in verify.sizes or not all(math.isfinite(m) and m > 0 for m in verify.sizes):
            raise ValueError(f"verify.sizes must be positive multiples of N_opt including 1, got {verify.sizes}")
        if verify.seeds is not None and (not verify.seeds or len(set(verify.seeds)) < len(verify.seeds)):
            raise ValueError(f"verify.seeds must list one or more distinct seeds, got {verify.seeds}")


def evaluate_formula(key: str, formula: Any, variables: dict[str, float] | None) -> Any:
    """A hyperparameter for one run: a number, or a formula of `formula.NAMES` (`jaxformer.sweep.formula`).

    With ``variables`` None only the formula's grammar is checked. Errors name ``hyperparameters.<key>``.
    """
    if not isinstance(formula, str):
        return formula
    try:
        return check_formula(formula) if variables is None else formula_evaluate(formula, variables)
    except FormulaError as error:
        raise ValueError(f"hyperparameters.{key}: cannot evaluate {formula!r}: {error}") from None


# what a hyperparameter formula may depend on when branches share a trunk: not D, not C
TRUNK_NAMES = ("N", "d_model", "num_layers", "seed")


def check_branches(spec: SweepSpec) -> None:
    """Refuses ``branches: true`` on a spec whose trunk would depend on D: one line naming the field."""
    base = config_from_dict(dict(spec.base)).optimizer
    if base.schedule != "wsd":
        raise ValueError(f"branches: true needs base optimizer.schedule: wsd (a stable phase to fork cooldowns "
                         f"from), got {base.schedule!r}")
    if base.warmup_tokens is None:
        raise ValueError("branches: true needs base optimizer.warmup_tokens (a warmup_fraction would make the "
                         "warmup, and so the trunk, differ per D)")
    for key, formula in spec.hyperparameters.items():
        try:
            if isinstance(formula, str):
                check_formula(formula, TRUNK_NAMES)
        except FormulaError:
            raise ValueError(f"hyperparameters.{key}: with branches: true, the branches of a trunk share it, so it "
                             f"may depend on {', '.join(TRUNK_NAMES)} only, not on D or C (got {formula!r})") from None


def load_spec(path: str | Path) -> SweepSpec:
    """Reads and validates a sweep YAML: unknown keys, bad values and bad formulas raise ``ValueError``."""
    data = load_yaml(path)
    if "name" not in data and not re.fullmatch(NAME, Path(path).stem):
        raise ValueError(f"{path}: the spec has no name:, and its file name {Path(path).stem!r} is no plain name of "
                         "letters, digits, '.', '_' and '-' to stand for one; add name: NAME")
    data.setdefault("name", Path(path).stem)
    spec = from_dict(SweepSpec, data)
    config_from_dict(dict(spec.base))  # the base config must itself be valid
    check_planned_fields(spec.base, spec.hyperparameters)
    for key, formula in spec.hyperparameters.items():
        sections = ("model", "data", "optimizer", "train", "checkpoint", "logging", "parallel", "kernel")
        if not isinstance(key, str) or key.split(".")[0] not in sections:  # YAML keys may be numbers too: 1: 2
            raise ValueError(f"hyperparameters.{key}: not a training config field")
        if "." not in key or isinstance(formula, dict):  # a mapping would replace the base's whole section
            raise ValueError(f"hyperparameters.{key}: each key names one field, dotted, with a number or formula "
                             f"(e.g. optimizer.lr: \"3e-3 * (N / 1e4) ** -0.25\"), not a section")
        evaluate_formula(key, formula, None)  # the grammar, before anything is planned or evaluated
    if spec.tune is not None:
        tuned = {"optimizer.lr": "tune", "optimizer.beta2": "tune.beta2", "train.batch_size": "tune.batch_size"}
        for key, field in tuned.items():
            if key in spec.hyperparameters and (key == "optimizer.lr" or getattr(spec.tune, key.split(".")[1])):
                raise ValueError(f"{field} and hyperparameters.{key} both set {key}; keep one "
                                 "(the tuning stage sets what the runs train with)")
    if spec.branches:
        check_branches(spec)
    return spec
