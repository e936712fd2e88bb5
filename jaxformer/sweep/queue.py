"""The work queue a sweep's executors share: runs in order, each taken once its dependency has finished.

A sweep's stages overlap where the work allows it: a cooldown branch can train as soon as its own
trunk has finished (``after``), while other trunks still train, instead of after every trunk.
Just before a run is handed to a worker, ``prepare(name, finished)`` readies it (a branch: its
trunk's checkpoint linked in) or settles it without training (an `Outcome`: failed, busy).

A worker meeting a model shape for the first time compiles its programs; the persistent
compilation cache serves every later meeting, in any worker, once that first run has finished.
So a worker taking work prefers a run whose shape no other worker is compiling right now
(``shape``), rather than compiling the same programs twice at once.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable, Mapping, Sequence

from jaxformer.sweep.runs import Outcome

Group = tuple[str, ...]
Prepare = Callable[[str, Mapping[str, Outcome]], "Outcome | None"]


def as_groups(names: Iterable[str | Sequence[str]]) -> list[Group]:
    """Each item as a group: a name alone, or the names of runs to train together."""
    return [(item,) if isinstance(item, str) else tuple(item) for item in names]


class WorkQueue:
    """Groups of runs waiting for a worker (thread-safe).

    ``after[name]``: a run of this queue that must finish first. ``shape[name]``: a key equal for runs
    that compile the same programs. ``compiled``: shapes compiled before (a warm pool's, shared across
    queues and updated here).
    """

    def __init__(self, names: Iterable[str | Sequence[str]], *, after: Mapping[str, str] | None = None,
                 prepare: Prepare | None = None, shape: Mapping[str, str] | None = None,
                 compiled: set[str] | None = None) -> None:
        self.waiting = as_groups(names)
        queued = {name for group in self.waiting for name in group}
        # a dependency outside this queue has finished already (or trains elsewhere): `prepare` judges it
        self.after = {name: first for name, first in (after or {}).items() if first in queued}
        self.prepare, self.shape = prepare, dict(shape or {})
        self.compiled = compiled if compiled is not None else set()
        self.compiling: set[str] = set()  # shapes whose first run is training now
        self.finished: dict[str, Outcome] = {}
        self.condition = threading.Condition()

    def __len__(self) -> int:
        return len(self.waiting)

    def _ready(self, group: Group) -> bool:
        return all(self.after.get(name) is None or self.after[name] in self.finished for name in group)

    def _pick(self) -> Group | None:
        ready = [group for group in self.waiting if self._ready(group)]
        if not ready:
            return None
        fresh = [group for group in ready if not ({self.shape.get(name) for name in group} & self.compiling)]
        group = (fresh or ready)[0]
        self.waiting.remove(group)
        for name in group:
            if (key := self.shape.get(name)) is not None and key not in self.compiled:
                self.compiling.add(key)
        return group

    def take(self, *, wait: bool = True) -> tuple[Group, list[Outcome]] | None:
        """``(group, settled)``: the next group to train, less its runs that ``prepare`` settled (``settled``;
        the group may be left empty). None when nothing is left, or (``wait=False``) nothing is ready yet;
        with ``wait`` it blocks until a dependency finishes."""
        with self.condition:
            while True:
                if not self.waiting:
                    return None
                group = self._pick()
                if group is not None:
                    break
                if not wait:
                    return None
                self.condition.wait()
        settled = [outcome for name in group if self.prepare
                   and (outcome := self.prepare(name, dict(self.finished))) is not None]
        if settled:
            self.finish(settled)
        left = {outcome.name for outcome in settled}
        return tuple(name for name in group if name not in left), settled

    def abandon(self) -> None:
        """Drops the groups not yet taken, waking every `take` (to return None): an executor failed."""
        with self.condition:
            self.waiting.clear()
            self.condition.notify_all()

    def finish(self, outcomes: Iterable[Outcome]) -> None:
        """Records finished runs: their dependants become ready and their shapes compiled."""
        with self.condition:
            for outcome in outcomes:
                self.finished[outcome.name] = outcome
                if (key := self.shape.get(outcome.name)) is not None:
                    self.compiling.discard(key)
                    self.compiled.add(key)
            self.condition.notify_all()
