"""WSD trunks and cooldown branches: one stable-learning-rate run per model, a cooldown forked from it per D.

With ``branches: true`` in a sweep spec whose base trains on the ``wsd`` schedule with its warmup
in tokens (``optimizer.warmup_tokens``), the runs that agree on everything but ``train.tokens``
(model shape, seed, hyperparameters) share one *trunk*, and each planned run becomes a *branch*:
it starts from the trunk's checkpoint at its *fork step* and trains only the rest of its schedule. The
planner forks the runs (`jaxformer.sweep.plan.fork_runs`) and the spec refuses what cannot branch
(`jaxformer.sweep.spec.check_branches`); this module trains trunks and branches.

Fork step of a run of S updates whose cooldown takes c = ``cooldown_steps(S)`` of them:
F = S − c − 1. Update k (0-based) reads the schedule at k + 1 (`jaxformer.train.optimizer`), so
updates 0 … S − c − 2 are at the peak exactly; update S − c − 1 reads the cooldown's start, the
peak only up to rounding, so the branch takes it. F must be at least the warmup (and one step).

A trunk is its branches' config on the ``constant`` schedule (the same warmup, then the peak)
for T = max F + 1 updates, checkpointing at every fork step and keeping those checkpoints
(``checkpoint.steps``). Its learning rates before each F are the branch's, bit for bit, and so
are its batches (the loader's state is the count of samples read, whatever the run's length);
the one step past the last fork makes every fork an ordinary step of the trunk (a run's last
step also logs, which resets the loss sums a checkpoint holds). A branch's run directory is
seeded with the trunk's checkpoint at F (hard links), its ``data.json``, ``tokenizer.json`` and
metrics rows up to F, and ``fork.json`` naming the trunk and step; the ordinary resume then
continues it, so a branch ends bit-identical to a straight run of its length (on one machine).

Compute, under the sweep's ``flops`` rule: the trunks' T steps plus each branch's S − F steps,
against every run's S steps from scratch (`BranchCompute`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Callable

from jaxformer.accounting import training_flops_per_token
from jaxformer.configs import to_dict
from jaxformer.files import read_json, write_json_atomic, write_text_atomic
from jaxformer.sweep.plan import PlannedRun
from jaxformer.sweep.runs import TO_TRAIN, Outcome, RunPaths, run_lock, saved_config
from jaxformer.train.checkpoint_config import has_checkpoints
from jaxformer.train.config import TrainConfig, config_from_dict, config_to_dict, resume_conflict


def trunks_of(runs: list[PlannedRun]) -> list[PlannedRun]:
    """The trunks of the branches among ``runs`` (none when no run is a branch), in order of their first branch."""
    groups: dict[str, list[PlannedRun]] = {}
    for run in runs:
        if run.trunk is not None:
            groups.setdefault(run.trunk, []).append(run)
    return [_trunk(name, branches) for name, branches in groups.items()]


def trunk_config(config: dict, forks: list[int]) -> TrainConfig:
    """The trunk of branches of ``config`` (any of them) forking at ``forks``: the ``constant`` schedule for one
    step past the last fork, checkpoints at every fork and kept (``checkpoint.steps``)."""
    data = copy.deepcopy(config)
    data["train"]["tokens"] = (max(forks) + 1) * data["train"]["batch_size"] * data["train"]["seq_len"]
    data["optimizer"]["schedule"] = "constant"
    data["checkpoint"]["steps"] = sorted(set(forks))
    return config_from_dict(data)


def _trunk(name: str, branches: list[PlannedRun]) -> PlannedRun:
    """The trunk of ``branches`` as a run: its config (`trunk_config`), tokens and FLOPs."""
    first = branches[0]
    config = trunk_config(first.config, [run.fork_step for run in branches])
    tokens = config.total_steps * config.tokens_per_step
    counts = {rule: tokens * training_flops_per_token(config.model, config.train.seq_len, rule)
              for rule in ("exact", "6ND")}
    return PlannedRun(name=name, N=first.N, N_non_embedding=first.N_non_embedding, D=tokens,
                      C=counts[first.flops_rule], C_exact=counts["exact"], C_6nd=counts["6ND"],
                      flops_rule=first.flops_rule, budget=None, target_params=first.target_params,
                      steps=config.total_steps, seed=first.seed, config=to_dict(config))


@dataclasses.dataclass(frozen=True)
class BranchCompute:
    """Training FLOPs (the sweep's ``flops`` rule) of a branched sweep against its runs trained from scratch.

    independent: Σ C of the branches as runs from scratch; trunks: Σ C of the trunks; cooldowns: Σ over
    the branches of C · (S − F) / S, the steps each trains past its fork.
    """

    independent: float
    trunks: float
    cooldowns: float
    trunk_count: int
    branch_count: int

    @classmethod
    def of(cls, runs: list[PlannedRun], trunks: list[PlannedRun]) -> "BranchCompute":
        """Over the branches among ``runs`` and their ``trunks``."""
        branches = [run for run in runs if run.trunk is not None]
        return cls(sum(run.C for run in branches), sum(trunk.C for trunk in trunks),
                   sum(run.C * (run.steps - run.fork_step) / run.steps for run in branches), len(trunks),
                   len(branches))

    @property
    def branched(self) -> float:
        return self.trunks + self.cooldowns

    @property
    def saved(self) -> float:
        """The fraction of the independent runs' FLOPs the branches do not spend."""
        return 1 - self.branched / self.independent

    def line(self) -> str:
        return (f"branches: {self.trunk_count} trunks ({self.trunks:.3g} FLOPs) + {self.branch_count} cooldowns "
                f"({self.cooldowns:.3g} FLOPs) = {self.branched:.3g} FLOPs against {self.independent:.3g} for the "
                f"runs trained from scratch: {self.saved:.1%} saved")


def copy_fork(trunk_dir: Path, step: int, branch_dir: Path) -> None:
    """Seeds ``branch_dir`` with the trunk's checkpoint ``step`` (hard links where the filesystem allows),
    its ``data.json`` and ``tokenizer.json``, its metrics rows up to ``step`` and ``fork.json``.

    The checkpoint moves into place last, in one rename: a copy cut short leaves no checkpoint,
    and the next launch copies again. Raises ``ValueError`` when the trunk has no such checkpoint.
    """
    trunk_dir, branch_dir = Path(trunk_dir), Path(branch_dir)
    source = trunk_dir / "checkpoints" / str(step)
    if not (source / "meta").is_dir():
        raise ValueError(f"trunk {trunk_dir.name} has no checkpoint at its fork step {step} ({source})")
    branch_dir.mkdir(parents=True, exist_ok=True)
    for name in ("data.json", "tokenizer.json"):
        if (trunk_dir / name).is_file():
            shutil.copyfile(trunk_dir / name, branch_dir / name)
    rows = (trunk_dir / "metrics.jsonl").read_text().splitlines() if (trunk_dir / "metrics.jsonl").is_file() else []
    write_text_atomic(branch_dir / "metrics.jsonl",
                      "".join(row + "\n" for row in rows if json.loads(row)["step"] <= step))
    digest = read_json(source / "meta" / "metadata").get("digest")
    write_json_atomic(branch_dir / "fork.json", {"trunk": trunk_dir.name, "step": step, "checkpoint": str(source),
                                                 "digest": digest})
    staging = branch_dir / f".fork-{step}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, copy_function=_link_or_copy)
    (branch_dir / "checkpoints").mkdir(exist_ok=True)
    os.rename(staging, branch_dir / "checkpoints" / str(step))


def _link_or_copy(source: str, target: str) -> None:
    """A hard link (checkpoint files are never written again), or a copy across filesystems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def start_branch(sweep_dir: Path, run: PlannedRun) -> None:
    """Seeds branch ``run`` from its trunk (`copy_fork`) unless it holds checkpoints of its own already.

    Raises ``ValueError`` naming the trunk when it did not finish, or when its saved config differs
    from the branch's in anything but the length and the schedule (its fork would not start this run).
    """
    paths, trunk = RunPaths(sweep_dir, run.name), RunPaths(sweep_dir, run.trunk)
    if has_checkpoints(paths.run_dir):
        return
    if trunk.state() != "done":
        why = read_json(trunk.status).get("reason", trunk.state())
        raise ValueError(f"its trunk {run.trunk} did not finish ({why})")
    saved = config_to_dict(config_from_dict(saved_config(trunk.run_dir / "config.yaml")))
    branch = config_from_dict(run.config)
    saved["train"]["tokens"], saved["optimizer"]["schedule"] = branch.train.tokens, branch.optimizer.schedule
    conflict = resume_conflict(saved, branch)
    if conflict:
        raise ValueError(f"cannot fork {run.name} from its trunk {run.trunk}: {conflict}")
    copy_fork(trunk.run_dir, run.fork_step, paths.run_dir)


def train_branched(sweep_dir: Path, runs: list[PlannedRun], trunks: list[PlannedRun], wanted: set[str],
                   train: Callable[..., list[Outcome]], report: Callable[[str], None]) -> list[Outcome]:
    """Trains the trunks and the runs whose state is in ``wanted``: each branch as soon as its trunk has finished
    (while other trunks may still train), trunks before branches when both are ready; the outcomes of both.

    ``train(planned, names, initial, after=, prepare=)`` trains ``names`` (the launch's executors,
    `jaxformer.sweep.queue.WorkQueue`). A branch whose trunk did not finish is recorded failed, its
    reason naming the trunk; one whose trunk trains in another launch is left to it (``busy``).
    Every other branch trains regardless, and so do runs that are no branch (an adapt round's).
    """
    initial, todo = {}, []
    for run in trunks + runs:
        state = RunPaths(sweep_dir, run.name).state()
        initial[run.name] = "queued" if state in TO_TRAIN else state
        if state in wanted:
            todo.append(run.name)
    branches = {run.name: run for run in runs if run.trunk is not None}
    report(f"trunks: {len(trunks)}, {sum(trunk.name in todo for trunk in trunks)} to train; each branch trains "
           "from its trunk's checkpoint once that trunk has finished")

    def prepare(name: str, finished: dict[str, Outcome]) -> Outcome | None:
        run = branches.get(name)
        if run is None:
            return None
        trunk = finished.get(run.trunk)
        if trunk is not None and trunk.status == "busy":
            return Outcome(run.name, "busy", f"its trunk {run.trunk} trains in another launch")
        with run_lock(RunPaths(sweep_dir, run.name)) as mine:  # two launches never seed one branch at once
            if not mine:
                return Outcome(run.name, "busy", "another launch holds its lock")
            try:
                start_branch(sweep_dir, run)
            except (ValueError, OSError) as error:
                RunPaths(sweep_dir, run.name).record("failed", reason=str(error))
                report(f"failed {run.name}: {error}")
                return Outcome(run.name, "failed", str(error))
        return None

    outcomes = train(trunks + runs, todo, initial, after={name: run.trunk for name, run in branches.items()},
                     prepare=prepare)
    report(BranchCompute.of(runs, trunks).line())
    return outcomes
