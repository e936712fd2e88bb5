"""A damaged sweep directory, built here without training: a final.json cut short or emptied is no finished run (the
table says so, a fit refuses it, as it does in a directory of runs trained apart, and a relaunch trains the run again,
replacing the file); a damaged saved config is refused in one line naming it."""

import dataclasses
import json

import pytest
import yaml

from jaxformer.cli import main
from jaxformer.sweep.branches import start_branch
from jaxformer.sweep.directory import prepare_directory, write_plan
from jaxformer.sweep.launch import LaunchOptions, launch
from jaxformer.sweep.plan import plan_runs
from jaxformer.sweep.results import collect
from jaxformer.sweep.runs import RunPaths, changed_setting, failure_reason
from jaxformer.sweep.spec import load_spec
from jaxformer.sweep.table import sweep_table
from sweep_helpers import TINY, InProcessPool, variant

FINISHED = {"params": 8240, "tokens": 20224, "val_loss": 3.25, "train_loss": 3.5}
DAMAGED = {  # final.json's text, and what the table and a fit say is wrong with it (`final.damage`)
    "cut short": ('{"params": 8240, "tokens": 20224, "val_lo',
                  "not valid JSON (Unterminated string starting at line 1, column 35)"),
    "emptied": ("", "empty, not JSON"),
    "an empty object": ("{}", "no val_loss, so not a finished run's record"),
    "no object": ("[3.25]", "a JSON list, not a run's record (a JSON object)"),
    "a non-finite loss": ('{"val_loss": NaN}', "val_loss is nan, not a finite number"),
    "a loss as text": ('{"val_loss": "3.25"}', "val_loss is '3.25', not a finite number"),
    "a loss as a boolean": ('{"val_loss": true}', "val_loss is True, not a finite number"),
    # `jaxformer results` showed these values as the run's (D = lots, a train loss of x), and the fit took 1e15 tokens
    "a token count as text": ('{"tokens": "lots", "val_loss": 3.25}', "tokens is 'lots', not a positive number"),
    "a token count not its steps'": ('{"tokens": 1e15, "steps": 79, "batch_size": 8, "seq_len": 32, "val_loss": 3.25}',
                                     "tokens is 1000000000000000.0, not steps × batch_size × seq_len = 20,224"),
    "a train loss as text": ('{"val_loss": 3.25, "train_loss": "x"}',
                             "train_loss is 'x', not a non-negative finite number"),
}


def sweep_dir(tmp_path, spec_path=TINY):
    """A sweep directory as a launch prepares it (spec's plan.json and configs), no run begun."""
    spec = load_spec(spec_path)
    runs, out = plan_runs(spec), tmp_path / "out"
    (out / "configs").mkdir(parents=True)
    write_plan(spec, runs, out)
    return spec, runs, out


def write_final(out, name: str, text: str) -> None:
    paths = RunPaths(out, name)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    paths.final.write_text(text)


@pytest.mark.parametrize("damage", DAMAGED)
def test_a_damaged_final_json_is_no_finished_run_in_the_table(tmp_path, damage):
    """The reason names the file and what is wrong with it (it said only "holds no finished run's record (a JSON
    object with a finite val_loss)", whatever the damage)."""
    _, runs, out = sweep_dir(tmp_path)
    text, wrong = DAMAGED[damage]
    write_final(out, runs[0].name, json.dumps(FINISHED))
    write_final(out, runs[1].name, text)
    assert [RunPaths(out, run.name).state() for run in runs] == ["done", "damaged", "queued", "queued"]
    finished, damaged, *_ = collect(out)
    assert (finished["status"], finished["loss"], finished["D"], finished["reason"]) == ("done", 3.25, 20224, "")
    assert (damaged["status"], damaged["loss"], damaged["train_loss"], damaged["D"]) == ("damaged", None, None, 9984)
    assert damaged["reason"] == (f"{RunPaths(out, runs[1].name).final} holds no finished run's record: {wrong}; a "
                                 "relaunch trains it again")
    with pytest.raises(ValueError) as error:  # what `jaxformer fit` reads: refused in the same words
        sweep_table(out)
    assert str(error.value) == damaged["reason"]


@pytest.mark.parametrize("damage", DAMAGED)
def test_a_damaged_final_json_in_runs_trained_apart_is_refused_by_a_fit_too(tmp_path, capsys, damage):
    """A directory of runs with no plan.json (trained by `jaxformer train`, not a sweep): the same refusal, naming the
    file, without the relaunch a sweep would make; the finished runs alone fit as they read."""
    for n in (1000, 2000, 4000):
        run_dir = tmp_path / "runs" / f"n{n}"
        run_dir.mkdir(parents=True)
        (run_dir / "final.json").write_text(json.dumps({**FINISHED, "params": n, "tokens": 20 * n,
                                                        "flops_exact": 120 * n * n, "val_loss": 3 + 100 / n}))
    assert sweep_table(tmp_path / "runs").loss.tolist() == [3.1, 3.05, 3.025]
    damaged = tmp_path / "runs" / "a" / "final.json"
    damaged.parent.mkdir()
    text, wrong = DAMAGED[damage]
    damaged.write_text(text)
    reason = f"{damaged} holds no finished run's record: {wrong}"
    with pytest.raises(ValueError) as error:
        sweep_table(tmp_path / "runs")
    assert str(error.value) == reason
    capsys.readouterr()
    assert main(["fit", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == f"jaxformer fit: error: {reason}\n"
    assert damaged.read_text() == text  # a fit only reads


def test_a_relaunch_trains_the_damaged_and_missing_runs_replacing_their_final_json(tmp_path, monkeypatch):
    """Each damaged final.json is removed before its run trains again (never read as a finished run's, nor merged
    into the new one); the finished run is not trained, and results.csv holds every run's loss."""
    from jaxformer.train.attempt import Attempt

    spec, runs, out = sweep_dir(tmp_path)
    write_final(out, runs[0].name, json.dumps(FINISHED))
    write_final(out, runs[1].name, DAMAGED["cut short"][0])
    write_final(out, runs[2].name, DAMAGED["an empty object"][0])
    trained = []

    def attempt_together(config_paths, overrides, run_dirs):  # the worker's training, as a run writes final.json
        attempts = []
        for run_dir in run_dirs:
            assert not (run_dir / "final.json").exists()
            record = {"tokens": next(run.D for run in runs if run.name == run_dir.name), "val_loss": 3.0 - len(trained)}
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "final.json").write_text(json.dumps(record))
            trained.append(run_dir.name)
            attempts.append(Attempt("done", record))
        return attempts

    monkeypatch.setattr("jaxformer.train.attempt.attempt_together", attempt_together)
    lines = []
    pool = InProcessPool()
    result = launch(spec, runs, out, LaunchOptions(workers=1, threads=1), report=lines.append, pool=pool)
    assert trained == [run.name for run in runs[1:]]
    assert len(pool.compiled) == 2  # the pool learns the two model shapes its worker compiled, for later stages
    assert lines[0] == f"sweep tiny: 4 runs, 3 to train, local executor → {out}"
    assert lines[2] == (f"2 runs hold a damaged final.json and train again, from their last checkpoint where they "
                        f"have one: {runs[1].name}, {runs[2].name}")
    assert result.failed == [] and [row["status"] for row in result.rows] == ["done"] * 4
    table = (out / "results.csv").read_text().splitlines()
    assert [line.split(",")[:2] + [line.split(",")[11]] for line in table[1:]] == [
        [runs[0].name, "done", "3.25"], [runs[1].name, "done", "3.0"], [runs[2].name, "done", "2.0"],
        [runs[3].name, "done", "1.0"]]


@pytest.mark.parametrize("text, problem", [
    ("model: {d_model: [32\n", "invalid YAML (while parsing a flow sequence)"),
    ("", "empty, not a run's config"),
    ("a run's config\n", "expected a mapping at the top level, got str"),
    ("train: {bogus: 1}\n", "unknown config key 'train.bogus'"),
])
def test_a_begun_runs_damaged_config_is_refused_in_one_line_naming_it(tmp_path, capsys, text, problem):
    _, runs, out = sweep_dir(tmp_path)
    for run in runs:  # every run begun (done): a relaunch would train none
        write_final(out, run.name, json.dumps(FINISHED))
    config = RunPaths(out, runs[1].name).config
    config.write_text(text)
    assert main(["sweep", str(TINY), "--out", str(out), "--workers", "1"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"jaxformer sweep: error: {config}: {problem}") and error.count("\n") == 1, error
    assert config.read_text() == text and not (out / "results.csv").exists()


def test_a_trunks_damaged_config_fails_its_branch_naming_the_file(tmp_path):
    base = {**yaml.safe_load(TINY.read_text())["base"],
            "optimizer": {"schedule": "wsd", "warmup_tokens": 1024, "cooldown_fraction": 0.2}}
    _, runs, out = sweep_dir(tmp_path, variant(tmp_path, "branched", base=base, branches=True))
    branch = runs[0]
    trunk = RunPaths(out, branch.trunk)
    write_final(out, trunk.name, json.dumps(FINISHED))
    (trunk.run_dir / "config.yaml").write_text("model: {d_model: [32\n")
    with pytest.raises(ValueError, match=r"^\S+/runs/trunk-N8240-s0/config.yaml: invalid YAML \(while parsing"):
        start_branch(out, dataclasses.replace(branch))


def test_a_runs_status_file_makes_it_failed_only_when_it_records_a_failure(tmp_path):
    """A run recorded done whose final.json was removed (to train it again) is queued, not failed; a recorded
    failure is failed (trained again only with --retry-failed); a finished final.json is done whatever the status."""
    paths = RunPaths(tmp_path, "run")
    assert paths.state() == "queued"
    paths.record("done", wall_s=1.0)
    assert paths.state() == "queued"
    paths.record("failed", reason="NonFiniteLoss: loss is nan at step 3")
    assert paths.state() == "failed"
    paths.run_dir.mkdir(parents=True)
    paths.final.write_text(json.dumps(FINISHED))
    assert paths.state() == "done"


def test_runs_not_begun_may_change_and_a_begun_one_is_named(tmp_path):
    """A relaunch may change the runs no launch began (configs written, nothing trained: they train under the new
    plan); once one has begun (here: recorded failed), its change is named."""
    out = tmp_path / "out"
    spec = load_spec(variant(tmp_path, "before", hyperparameters={"optimizer.lr": "3e-3"}))
    runs = prepare_directory(spec, plan_runs(spec), out)  # what a launch writes before it trains
    changed = plan_runs(load_spec(variant(tmp_path, "after", hyperparameters={"optimizer.lr": "4e-3"})))
    assert all(RunPaths(out, run.name).config.is_file() for run in runs)
    assert changed_setting(out, changed) is None
    RunPaths(out, runs[1].name).record("failed", reason="NonFiniteLoss")
    assert changed_setting(out, changed) == f"{runs[1].name}: optimizer.lr was 0.003, now 0.004"


def test_a_failed_runs_reason_is_its_error_record_else_its_logs_last_line(tmp_path):
    paths = RunPaths(tmp_path, "run")
    assert failure_reason(paths, 3) == "exit status 3"  # no log, no record: a worker that never started
    paths.log.parent.mkdir(parents=True)
    paths.log.write_text("step 10 loss 3.2\nstep 20 loss 3.1\nKilled by the OOM killer\n\n")
    assert failure_reason(paths, -9) == "Killed by the OOM killer"
    paths.run_dir.mkdir(parents=True)
    (paths.run_dir / "error.json").write_text(json.dumps({"error": "NonFiniteLoss", "message": "loss is nan"}))
    assert failure_reason(paths, 1) == "NonFiniteLoss: loss is nan"


def test_a_finished_runs_row_holds_its_records_tokens_and_the_plans_tokens_per_parameter(tmp_path):
    spec, runs, out = sweep_dir(tmp_path)
    write_final(out, runs[0].name, json.dumps({**FINISHED, "tokens": runs[0].D + 256}))  # trained in whole steps
    row = collect(out)[0]
    assert (row["D"], row["loss"]) == (runs[0].D + 256, 3.25)
    assert row["tokens_per_param"] == runs[0].D / runs[0].N and row["C"] == runs[0].C


@pytest.mark.parametrize("plan", [{"runs": {"a": 1}}, {"runs": [{"name": "a", "N": 8240, "N_non_embedding": 7000,
                                                                "D": 2e4, "C": 1e9, "budget": 1e9}]}])
def test_a_plan_json_that_is_no_sweeps_plan_is_refused_in_one_line(tmp_path, plan):
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(ValueError, match=r"plan\.json: not a sweep's plan \(a list of runs, each with name, N, "
                                         r"N_non_embedding, D, C, budget, seed\)$"):
        collect(tmp_path)
