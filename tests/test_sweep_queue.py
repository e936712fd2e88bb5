"""The executors' work queue: dependencies, branches as soon as their trunk is done, one compile of a shape at once."""

import threading

import pytest

from jaxformer.sweep.executors import LocalPool
from jaxformer.sweep.queue import WorkQueue
from jaxformer.sweep.runs import Outcome


def done(*names):
    return [Outcome(name, "done") for name in names]


def test_a_branch_waits_for_its_own_trunk_only_and_trunks_go_first():
    queue = WorkQueue(["trunk-a", "trunk-b", "a1", "a2", "b1"], after={"a1": "trunk-a", "a2": "trunk-a", "b1": "trunk-b"})
    assert queue.take()[0] == ("trunk-a",)
    assert queue.take()[0] == ("trunk-b",)
    assert queue.take(wait=False) is None  # both trunks train: no branch is ready
    queue.finish(done("trunk-a"))
    assert queue.take()[0] == ("a1",)  # trunk-b still trains: trunk-a's branches go on
    assert queue.take()[0] == ("a2",)
    assert queue.take(wait=False) is None
    queue.finish(done("a1", "a2", "trunk-b"))
    assert queue.take()[0] == ("b1",) and queue.take() is None


def test_a_ready_trunk_goes_before_a_ready_branch():
    queue = WorkQueue(["trunk-a", "trunk-b", "trunk-c", "a1"], after={"a1": "trunk-a"})
    assert [queue.take()[0] for _ in range(2)] == [("trunk-a",), ("trunk-b",)]
    queue.finish(done("trunk-a"))
    assert queue.take()[0] == ("trunk-c",) and queue.take()[0] == ("a1",)


def test_a_dependency_outside_the_queue_is_left_to_prepare():
    seen = []

    def prepare(name, finished):
        seen.append((name, sorted(finished)))
        return Outcome(name, "failed", "its trunk trunk-x did not finish") if name == "x1" else None

    queue = WorkQueue(["x1", "y1"], after={"x1": "trunk-x", "y1": "trunk-y"}, prepare=prepare)
    group, settled = queue.take()
    assert group == () and [(o.name, o.status) for o in settled] == [("x1", "failed")]
    assert queue.finished["x1"].status == "failed"
    assert queue.take() == (("y1",), []) and seen == [("x1", []), ("y1", ["x1"])]


def test_a_second_worker_takes_another_shape_while_the_first_compiles_one():
    shape = {"a-lr1": "A", "a-lr2": "A", "b-lr1": "B", "b-lr2": "B"}
    compiled = set()
    queue = WorkQueue(list(shape), shape=shape, compiled=compiled)
    assert queue.take()[0] == ("a-lr1",)
    assert queue.take()[0] == ("b-lr1",)  # not a-lr2: its programs are being compiled by the first worker
    assert queue.take()[0] == ("a-lr2",)  # every shape is compiling: the first ready, in order
    queue.finish(done("a-lr1", "b-lr1", "a-lr2"))
    assert compiled == {"A", "B"}
    again = WorkQueue(["b-lr2", "a-lr3"], shape={"b-lr2": "B", "a-lr3": "A"}, compiled=compiled)
    assert [again.take()[0] for _ in range(2)] == [("b-lr2",), ("a-lr3",)] and not again.compiling


def test_a_worker_blocked_on_a_dependency_wakes_when_it_finishes():
    queue = WorkQueue(["trunk", "branch"], after={"branch": "trunk"})
    assert queue.take()[0] == ("trunk",)
    taken = []
    waiter = threading.Thread(target=lambda: taken.append(queue.take()))
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive() and not taken  # blocked: the branch's trunk still trains
    queue.finish(done("trunk"))
    waiter.join(timeout=5)
    assert taken == [(("branch",), [])]


def test_an_abandoned_queue_wakes_its_blocked_workers_with_nothing_left():
    queue = WorkQueue(["trunk", "branch"], after={"branch": "trunk"})
    assert queue.take()[0] == ("trunk",)
    taken = []
    waiter = threading.Thread(target=lambda: taken.append(queue.take()))
    waiter.start()
    queue.abandon()  # the trunk's supervisor failed: its branch will never be ready
    waiter.join(timeout=5)
    assert not waiter.is_alive() and taken == [None] and len(queue) == 0


def test_an_error_in_a_local_supervisor_is_raised_and_the_pool_ends(tmp_path):
    """A bug in preparing a run (here ``prepare`` raising) ends `LocalPool.run` with that error, instead of a sweep
    that stops short of its runs and exits 0 (the other supervisor, waiting for the failed one's run, is woken)."""
    def prepare(name, finished):
        raise RuntimeError(f"cannot prepare {name}")

    queue = WorkQueue(["trunk", "branch"], after={"branch": "trunk"}, prepare=prepare)
    pool = LocalPool(2, 1, tmp_path)
    try:
        with pytest.raises(RuntimeError, match="cannot prepare trunk"):
            pool.run(tmp_path, queue, lambda name, event, outcome: None)
    finally:
        pool.close()
    assert all(worker.process is None for worker in pool.workers)  # no process was started for it
