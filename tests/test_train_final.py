"""`jaxformer train` on a run directory whose final.json is damaged (emptied, cut short, text, no object, no finite
val_loss), through the command's entry point. Without checkpoints: one line naming the file and what is wrong,
exit 2, the directory byte for byte unchanged. With them: the run trains again from its last checkpoint and the
file is replaced by the record it would have held, as a sweep's relaunch of a damaged run does."""

import json
import shutil
from pathlib import Path

import pytest

from jaxformer.cli import main
from test_bad_input import TINY_RUN, snapshot  # the tiny run there, and its directory digest

DAMAGED = {  # final.json's text -> what the refusal says is wrong with it
    "emptied": ("", "empty, not JSON"),
    "an empty object": ("{}", "no val_loss, so not a finished run's record"),
    "a non-finite loss": ('{"val_loss": NaN, "steps": 10}', "val_loss is nan, not a finite number"),
    "a loss as text": ('{"val_loss": "3.25"}', "val_loss is '3.25', not a finite number"),
    "text": ("the run went well\n", "not valid JSON (Expecting value at line 1, column 1)"),
    "cut short": ('{"params": 8240, "val_lo', "not valid JSON (Unterminated string starting at line 1, column 18)"),
    "no object": ("[3.25]", "a JSON list, not a run's record (a JSON object)"),
    "a count as text": ('{"val_loss": 3.25, "steps": "ten"}', "steps is 'ten', not a positive number"),
    "a count of zero": ('{"val_loss": 3.25, "steps": 0}', "steps is 0, not a positive number"),
    "a negative measure": ('{"val_loss": 3.25, "wall_s": -1.5}', "wall_s is -1.5, not a non-negative finite number"),
}


def train(root: Path, run_dir: Path) -> int:
    """`jaxformer train` of the tiny run into ``run_dir``: the command's exit status."""
    return main(["train", str(root / "empty.yaml"), *TINY_RUN, "--run-dir", str(run_dir)])


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished tiny run (10 steps, checkpoints at 5 and 10) in ``ROOT/run``."""
    root = tmp_path_factory.mktemp("final")
    (root / "empty.yaml").write_text("{}\n")
    assert train(root, root / "run") == 0
    return root


@pytest.mark.parametrize("damage", DAMAGED)
def test_a_damaged_final_json_without_checkpoints_is_one_line_and_changes_nothing(finished, tmp_path, capsys, damage):
    text, wrong = DAMAGED[damage]
    run_dir = tmp_path / "run"
    shutil.copytree(finished / "run", run_dir, ignore=shutil.ignore_patterns("checkpoints"))
    (run_dir / "final.json").write_text(text)
    before = snapshot(run_dir)
    code, err = train(finished, run_dir), capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"jaxformer train: error: {run_dir / 'final.json'}: {wrong}"), lines[0]
    assert lines[0].endswith(f"; {run_dir} holds no checkpoint to train the run again from (remove final.json to "
                             "train it from the start, or use a new train.run_dir)"), lines[0]
    assert snapshot(run_dir) == before  # the damaged file kept as it was, and no error.json beside it


@pytest.mark.parametrize("damage", ["emptied", "an empty object"])
def test_a_damaged_final_json_with_checkpoints_trains_again_from_the_last_one(finished, tmp_path, capsys, damage):
    text, wrong = DAMAGED[damage]
    run_dir = tmp_path / "run"
    shutil.copytree(finished / "run", run_dir)
    original = json.loads((run_dir / "final.json").read_text())
    (run_dir / "final.json").write_text(text)
    kept = {path: digest for path, digest in snapshot(run_dir).items() if path != "final.json"}
    code, (out, err) = train(finished, run_dir), capsys.readouterr()
    assert code == 0, err
    assert f"note: {run_dir / 'final.json'}: {wrong}; training the run again from its last checkpoint" in err
    assert f"resumed from step 10 (checkpoint {run_dir / 'checkpoints' / '10'})" in err
    record = json.loads((run_dir / "final.json").read_text())
    same = ("params", "tokens", "steps", "flops_6nd", "train_loss", "val_loss", "val_bits_per_byte", "data", "config")
    assert {key: record[key] for key in same} == {key: original[key] for key in same}
    assert record["resumed_from"] == {"step": 10, "checkpoint": str(run_dir / "checkpoints" / "10")}
    assert f"val loss {original['val_loss']:.4f} nats/token" in out
    after = snapshot(run_dir)
    assert {path: after[path] for path in kept} == kept  # checkpoints, metrics and config as they were


def test_a_record_with_only_a_finite_val_loss_is_a_finished_run(finished, tmp_path, capsys):
    """A finished run's record is a JSON object with a finite val_loss, its other fields optional
    (`jaxformer.train.final`): the command reports what it holds and trains nothing."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished / "run", run_dir)
    (run_dir / "final.json").write_text('{"val_loss": 3.25, "train_loss": null}')
    before = snapshot(run_dir)
    code, (out, err) = train(finished, run_dir), capsys.readouterr()
    assert code == 0, err
    assert out == f"done: val loss 3.2500 nats/token -> {run_dir / 'final.json'}\n"
    assert snapshot(run_dir) == before


def test_counts_of_one_and_measures_of_zero_or_a_fraction_are_a_finished_runs(tmp_path):
    """Counts are positive (one step of one sequence of one token is one), measures non-negative: a train loss of 0
    (a memorised batch), a quarter of an epoch."""
    from jaxformer.train.final import damage, finished_record

    record = {"val_loss": 0.5, "params": 1, "tokens": 1, "steps": 1, "batch_size": 1, "seq_len": 1, "train_loss": 0.0,
              "epochs": 0.25, "val_bits_per_byte": 0.7, "wall_s": 0}
    path = tmp_path / "final.json"
    path.write_text(json.dumps(record))
    assert finished_record(path) == record and damage(path) is None
