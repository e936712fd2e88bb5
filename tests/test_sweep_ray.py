"""The Ray executor's resources and failures, without a Ray cluster: a request no actor can meet is refused before
anything is written, and a dead actor is replaced (its group resumed once, then recorded failed) while the other
runs go on. `test_sweep.py` and `test_sweep_together.py` train on a local Ray instance."""

import json
import os
import threading
from types import SimpleNamespace

import pytest

from jaxformer.cli import main
from jaxformer.sweep.executors import local_ray_cpus, ray_actor_count, run_ray
from jaxformer.sweep.queue import WorkQueue
from jaxformer.sweep.runs import Outcome, RunPaths
from sweep_helpers import variant


TOO_FEW_CPUS = r"^--threads 4: each Ray actor asks for 4 CPUs, and the largest Ray node has 2$"


def test_the_actors_are_capped_by_the_cluster_and_refused_when_none_fits():
    assert ray_actor_count([{"CPU": 4.0}], 2, 0.0, workers=8) == 2  # --workers 8 on a 4-CPU cluster: 2 of 2 CPUs
    assert ray_actor_count([{"CPU": 4.0}], 2, 0.0, workers=1) == 1
    assert ray_actor_count([{"CPU": 8.0, "GPU": 2.0}], 1, 1.0, workers=4) == 2
    with pytest.raises(ValueError, match=r"^--gpus-per-run 1: the largest Ray node has 0 GPUs$"):
        ray_actor_count([{"CPU": 16.0}], 1, 1.0)
    with pytest.raises(ValueError, match=r"^--gpus-per-run 0.5: the largest Ray node has 0.25 GPUs$"):
        ray_actor_count([{"CPU": 16.0, "GPU": 0.25}], 1, 0.5, workers=1)
    with pytest.raises(ValueError, match=TOO_FEW_CPUS):
        ray_actor_count([{"CPU": 2.0}], 4, 0.0)


def test_each_node_holds_whole_actors_of_its_own_resources():
    """Cluster totals overcount: 2 nodes of 3 CPUs hold two 2-CPU actors, not three (the third would wait for
    ever); 4 nodes of 2 CPUs hold no 4-CPU actor although the cluster has 8; GPUs and CPUs count on one node."""
    assert ray_actor_count([{"CPU": 3.0}, {"CPU": 3.0}], 2, 0.0) == 2
    assert ray_actor_count([{"CPU": 3.0}, {"CPU": 3.0}], 2, 0.0, workers=3) == 2
    with pytest.raises(ValueError, match=TOO_FEW_CPUS):
        ray_actor_count([{"CPU": 2.0}] * 4, 4, 0.0)
    assert ray_actor_count([{"CPU": 8.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 4.0}], 1, 1.0) == 2  # 1 + 1, not 5
    with pytest.raises(ValueError, match=r"^--threads 2 --gpus-per-run 1: no Ray node has both the CPUs and the GPUs "
                                         r"of one actor$"):
        ray_actor_count([{"CPU": 4.0}, {"CPU": 1.0, "GPU": 1.0}], 2, 1.0)


def test_a_node_without_cpus_holds_no_actor():
    """Ray leaves a resource of zero out of a node's resources: a head node started with ``--num-cpus 0`` (kept for
    Ray's own processes) has no "CPU" at all, and a cluster whose nodes have all left has no node."""
    head = {"memory": 8e9, "node:__internal_head__": 1.0}
    assert ray_actor_count([head, {"CPU": 2.0}], 1, 0.0) == 2
    with pytest.raises(ValueError, match=r"^--threads 1: each Ray actor asks for 1 CPUs, and the largest Ray node "
                                         r"has 0$"):
        ray_actor_count([head], 1, 0.0)
    with pytest.raises(ValueError, match=r"^--gpus-per-run 1: the largest Ray node has 0 GPUs$"):
        ray_actor_count([], 1, 1.0)


def test_a_local_ray_instance_has_room_for_the_actors_asked_for():
    assert local_ray_cpus(1, 2) == 2 and local_ray_cpus(3, 2) == 6 and local_ray_cpus(3, 0) == 3
    assert local_ray_cpus(None, 1) == os.cpu_count()
    assert local_ray_cpus(None, 4 * os.cpu_count()) == 4 * os.cpu_count()  # one actor of more threads than cores


@pytest.mark.parametrize("flags, address_resources, message", [
    (["--workers", "1", "--threads", "2", "--gpus-per-run", "1"], None,
     "--gpus-per-run 1: the largest Ray node has 0 GPUs"),
    (["--workers", "1", "--threads", "2", "--ray-address", "auto"], {"CPU": 1.0},
     "--threads 2: each Ray actor asks for 2 CPUs, and the largest Ray node has 1"),
])
def test_a_ray_request_no_actor_can_meet_exits_2_before_anything_is_written(tmp_path, monkeypatch, capsys, flags,
                                                                           address_resources, message):
    """A local instance starts with the CPUs the layout asks for (and the GPUs Ray finds: none here); a request
    that not one actor can meet is refused in one line, where it used to wait for ever."""
    started = []

    def connect(address, cpus):
        started.append((address, cpus))
        resources = address_resources if address else {"CPU": float(cpus)}
        dead = {"Alive": False, "Resources": {"CPU": 64.0}}  # a node that left the cluster holds no actor
        return SimpleNamespace(nodes=lambda: [{"Alive": True, "Resources": resources}, dead])

    monkeypatch.setattr("jaxformer.sweep.launch.connect_ray", connect)
    spec, out = variant(tmp_path, "ray-refused", isoflop={"budgets": [1e9], "params": [8e3]}), tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--executor", "ray", *flags]) == 2
    assert capsys.readouterr().err == f"jaxformer sweep: error: {message}\n"
    assert started == [("auto", 2) if address_resources else (None, 2)] and not out.exists()


class ActorDied(Exception):
    """Stands in for ``ray.exceptions.RayActorError``."""


class FakeRay:
    """The calls `run_ray` makes, answered in this process: an actor trains a group at once (each run ``done``),
    unless ``deaths[name]`` says how many more times the actor training a group with that run dies."""

    exceptions = SimpleNamespace(RayActorError=ActorDied)

    def __init__(self, deaths: dict[str, int]) -> None:
        self.deaths, self.actors, self.requests, self.closed, self.killed = dict(deaths), [], [], [], []

    def remote(self, **options):
        self.options = options
        return lambda cls: SimpleNamespace(remote=self._start)

    def _start(self, sweep_dir: str, threads: int, slot: int):
        actor = SimpleNamespace(slot=slot, dead=False)
        actor.train_group = SimpleNamespace(remote=lambda group: lambda: self._train(actor, group))
        actor.close = SimpleNamespace(remote=lambda: lambda: self.closed.append(actor.slot))
        self.actors.append(actor)
        return actor

    def _train(self, actor, group):
        self.requests.append((actor.slot, group))
        for name in group:
            if self.deaths.get(name):
                self.deaths[name] -= 1
                raise ActorDied("The actor died unexpectedly before finishing this task.\n\tclass_name: _RayWorker")
        return [Outcome(name, "done") for name in group]

    def kill(self, actor):
        self.killed.append(actor.slot)

    @staticmethod
    def wait(references, num_returns):
        return references[:num_returns], references[num_returns:]

    @staticmethod
    def get(reference):
        return reference()


def test_a_dead_ray_actor_is_replaced_and_its_group_resumed_by_the_new_one(tmp_path):
    ray, events = FakeRay({"b": 1}), []
    queue = WorkQueue(["a", ("b", "c"), "d"])
    outcomes = run_ray(ray, tmp_path, queue, 2, 3, 0.0, lambda name, what, outcome: events.append((name, what)))
    assert sorted((o.name, o.status) for o in outcomes) == [("a", "done"), ("b", "done"), ("c", "done"), ("d", "done")]
    assert ray.options == {"num_cpus": 3, "num_gpus": 0.0, "max_restarts": 0}
    assert [slot for slot, group in ray.requests if group == ("b", "c")] == [0, 2]  # actor 0 died; its replacement 2
    assert sorted(ray.closed) == [1, 2] and ray.killed == [0]  # the live actors are ended, the dead one killed
    assert ("b", "finished") in events and ("c", "finished") in events


def test_a_group_whose_actors_die_twice_is_recorded_failed_and_the_others_train(tmp_path):
    ray = FakeRay({"b": 2})
    finished = RunPaths(tmp_path, "e")  # finished before its actor died: still done
    finished.run_dir.mkdir(parents=True)
    (finished.run_dir / "final.json").write_text('{"val_loss": 2.5}')
    outcomes = run_ray(ray, tmp_path, WorkQueue([("b", "c", "e"), "a"]), 1, 1, 0.0, lambda *event: None)
    by_name = {outcome.name: outcome for outcome in outcomes}
    assert by_name["a"].status == "done" and len(ray.actors) == 3  # one actor, replaced twice
    assert ray.options == {"num_cpus": 1, "num_gpus": 0.0, "max_restarts": 0}
    assert by_name["e"].status == "done" and not (tmp_path / "status" / "e.json").exists()
    reason = "its Ray actor died 2 times (ActorDied: The actor died unexpectedly before finishing this task.)"
    for name in ("b", "c"):
        assert (by_name[name].status, by_name[name].reason) == ("failed", reason)
        record = json.loads((tmp_path / "status" / f"{name}.json").read_text())
        assert (record["status"], record["reason"]) == ("failed", reason)


def test_a_run_waiting_for_another_is_handed_out_once_that_one_has_finished(tmp_path):
    """With two actors and a branch waiting for its trunk, the idle actor waits for the trunk's answer, not on the
    queue (which only this loop's own handling of that answer would wake), and the branch goes to an actor after it."""
    ray, events, outcomes = FakeRay({}), [], []
    queue = WorkQueue(["trunk", "branch"], after={"branch": "trunk"})

    def on_event(name, what, outcome):
        events.append((name, what))

    launch = threading.Thread(target=lambda: outcomes.extend(run_ray(ray, tmp_path, queue, 2, 1, 0.0, on_event)),
                              daemon=True)
    launch.start()
    launch.join(timeout=10)
    assert not launch.is_alive(), "run_ray waits for a run that only its own loop can hand out"
    assert [outcome.name for outcome in outcomes] == ["trunk", "branch"]
    assert [group for _, group in ray.requests] == [("trunk",), ("branch",)]
    assert events.index(("trunk", "finished")) < events.index(("branch", "running"))
