"""Grids that bracket (the sweep's ``isoflop.adapt``): sizes added beyond the edge where a budget's minimum lies.

A budget's minimum is bracketed as Approach 2 decides it (`jaxformer.scaling.isoflop.minimum_edge`):
the vertex of the parabola in ln N through its finished runs strictly inside the sampled sizes, and
the lowest loss at neither end. When it is not, the budget gets one more target size beyond that
edge, continuing its log-spacing (the smallest target ÷ ``step``, or the largest × ``step``, ``step``
being the ratio of neighbouring centred sizes), trains it and looks again, until every budget is
bracketed, has added ``limit`` sizes, or has no new size there (small models come in discrete
shapes: the next target may map to a shape the budget already has).

`adapt` is the loop; the training is a callable, so `jaxformer.sweep.launch` plans and trains real
runs with it and a test hands it the losses of a known law.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Literal, Sequence

import numpy as np

from jaxformer.scaling.isoflop import minimum_edge, parabola_minimum

Point = tuple[float, float]  # (N parameters, final loss in nats/token) of one finished run
Edge = Literal["lower", "upper"]
OUTCOMES = {"bracketed": "minimum bracketed", "limit": "not bracketed, at the limit of added sizes",
            "no new size": "not bracketed, no new size beyond the edge", "too few sizes": "fewer than 3 finished sizes"}


@dataclasses.dataclass(frozen=True)
class Proposal:
    """One size to add at budget C (``budget``, FLOPs): ``target`` parameters beyond the ``edge`` of its sampled
    sizes, the edge size being ``at`` parameters."""

    budget: float
    edge: Edge
    target: float
    at: float


@dataclasses.dataclass
class BudgetState:
    """One budget as the loop sees it.

    targets: the target sizes N planned at the budget C (``budget``, FLOPs), centred and added;
    points: (N, loss) of its finished runs; added: how many sizes the loop has added (earlier
    launches included); outcome: None while open, else a key of ``OUTCOMES``.
    """

    budget: float
    targets: list[float]
    points: list[Point]
    added: int = 0
    outcome: str | None = None


def next_size(budget: float, points: Sequence[Point], targets: Sequence[float], step: float) -> Proposal | None:
    """Where the minimum of budget C (FLOPs) lies unbracketed and the size to add there, None when it is bracketed.

    The proposal's ``target`` is the smallest of ``targets`` ÷ ``step`` beyond the lower edge, the
    largest × ``step`` beyond the upper; its ``at`` is that edge's sampled N. Raises ``ValueError``
    with fewer than three distinct sizes among ``points`` (no parabola).
    """
    N = np.array([n for n, _ in points], np.float64)
    loss = np.array([l for _, l in points], np.float64)
    if len(np.unique(N)) < 3:
        raise ValueError(f"{len(np.unique(N))} distinct finished sizes, need 3 for a parabola")
    edge = minimum_edge(N, loss, parabola_minimum(N, loss)[2])
    if edge is None:
        return None
    if edge == "lower":
        return Proposal(budget, edge, min(targets) / step, float(N.min()))
    return Proposal(budget, edge, max(targets) * step, float(N.max()))


def adapt(states: list[BudgetState], *, step: float, limit: int,
          train: Callable[[list[Proposal]], dict[Proposal, list[Point] | None]],
          report: Callable[[str], None]) -> list[BudgetState]:
    """Adds sizes until no budget is open; returns ``states``, each with its outcome.

    Each round proposes one size per open budget (`next_size`) and ``train`` trains them together,
    returning each proposal's new points: a list (empty when its runs failed; the size still counts
    toward ``limit``) or None when it adds no new size (the size rule maps it to a shape the budget
    has, or it cannot be planned). One line per proposal and a closing line go to ``report``.
    """
    while True:
        proposals = []
        for state in (s for s in states if s.outcome is None):
            try:
                proposal = next_size(state.budget, state.points, state.targets, step)
            except ValueError:
                state.outcome = "too few sizes"
                continue
            if proposal is None:
                state.outcome = "bracketed"
            elif state.added >= limit:
                state.outcome = "limit"
            else:
                proposals.append(proposal)
        if not proposals:
            break
        for p in proposals:
            report(f"adapt: C={p.budget:.3g} minimum at the {p.edge} edge (N={p.at:,.0f}); adding N≈{p.target:.2g}")
        trained = train(proposals)
        for p in proposals:
            state = next(s for s in states if s.budget == p.budget)
            if trained.get(p) is None:
                state.outcome = "no new size"
                continue
            state.targets.append(p.target)
            state.points += trained[p]
            state.added += 1
    groups = {key: [s for s in states if s.outcome == key] for key in OUTCOMES}
    report("adapt: " + "; ".join(
        f"{OUTCOMES[key]}: " + ", ".join(f"C={s.budget:.3g}" + (f" ({s.added} added)" if s.added else "") for s in mine)
        for key, mine in groups.items() if mine))
    return states
