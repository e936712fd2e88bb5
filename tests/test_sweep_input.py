"""A sweep's input, refused in one line naming the field and value before any run (``fit:``, a budget under one
token, a size beyond the shape rule), the dry run's table, and the results command's ``--output``, all in this
process and without training."""

import re

import pytest

from jaxformer.cli import main
from jaxformer.files import write_atomically
from jaxformer.models.presets import get_preset
from jaxformer.sweep.directory import write_plan
from jaxformer.sweep.launch import plan_table
from jaxformer.sweep.plan import plan_runs
from jaxformer.sweep.sizing import ShapeRule, shape_for_params
from jaxformer.sweep.spec import load_spec
from sweep_helpers import TINY, variant


@pytest.mark.parametrize("fit, message", [
    ({"bootstrap": -5}, "fit.bootstrap must be 0 (no intervals) or at least 2 resamples, got -5"),
    ({"bootstrap": 1}, "fit.bootstrap must be 0 (no intervals) or at least 2 resamples, got 1"),
    ({"approaches": []}, "fit.approaches must list distinct approaches of 1, 2 and 3, got []"),
    ({"approaches": [3, 3]}, "fit.approaches must list distinct approaches of 1, 2 and 3, got [3, 3]"),
    ({"approaches": [2, 4]}, "fit.approaches must list distinct approaches of 1, 2 and 3, got [2, 4]"),
])
def test_a_bad_fit_section_is_refused_at_load_in_one_line(tmp_path, capsys, fit, message):
    spec, out = variant(tmp_path, "bad-fit", fit=fit), tmp_path / "out"
    for flags in (["--dry-run", "--no-probe"], ["--out", str(out)]):
        assert main(["sweep", str(spec), *flags]) == 2
        assert capsys.readouterr().err == f"jaxformer sweep: error: {message}\n"
    assert not out.exists()


def test_a_budget_under_one_token_names_the_budget_not_train_tokens(tmp_path, capsys):
    spec = variant(tmp_path, "under-a-token", isoflop={"budgets": [1e3], "params": [8e3], "flops": "6ND"})
    assert main(["sweep", str(spec), "--dry-run", "--no-probe"]) == 2
    assert capsys.readouterr().err == ("jaxformer sweep: error: budget C=1e+03 is too small for params=8e+03 "
                                       "(N=8,240): 0 tokens is less than one step of 256 tokens\n")


def test_a_size_beyond_the_largest_shape_is_refused_as_one_below_the_smallest_is():
    base, rule = get_preset("tiny"), ShapeRule(head_dim=8, max_layers=2)
    with pytest.raises(ValueError) as error:
        shape_for_params(1e9, base, rule)
    assert str(error.value) == ("shape rule cannot reach params=1e+09: 2 layers (shape.max_layers) of up to 64 heads "
                                "(shape.max_heads) of width 8 hold at most 6,457,856 parameters")
    within = shape_for_params(6_457_856 / (1 - rule.tolerance) * 0.999, base, rule)  # short by just under 15%
    assert (within.num_layers, within.num_heads) == (2, 64)
    with pytest.raises(ValueError, match="cannot reach"):
        shape_for_params(6_457_856 / (1 - rule.tolerance) * 1.001, base, rule)


def test_the_dry_run_table_keeps_wide_values_apart(tmp_path):
    spec = load_spec(variant(tmp_path, "wide", isoflop={"budgets": [1e15], "params": [8e3], "flops": "6ND"}))
    runs = plan_runs(spec)
    header, row = plan_table(runs, workers=1, probe=False).splitlines()[:2]
    run = runs[0]
    assert row.split() == [run.name, f"{run.N:,}", f"{run.D:.3g}", f"{run.C:.3g}", f"{run.tokens_per_param:.1f}",
                           f"{run.steps:,}"]
    ends = [[match.end() for match in re.finditer(r"\S+", line)] for line in (header, row)]
    assert ends[1][1:] == ends[0][1:6]  # each value right-aligned under its heading


def test_results_output_errors_name_the_users_path_and_leave_no_temporary_file(tmp_path, capsys):
    spec = load_spec(TINY)
    (tmp_path / "out" / "configs").mkdir(parents=True)
    write_plan(spec, plan_runs(spec), tmp_path / "out")
    missing, directory = tmp_path / "missing" / "x.csv", tmp_path / "dd"
    directory.mkdir()
    assert main(["results", str(tmp_path / "out"), "--output", str(missing)]) == 2
    assert capsys.readouterr().err == f"jaxformer results: error: [Errno 2] No such file or directory: '{missing}'\n"
    assert main(["results", str(tmp_path / "out"), "--output", str(directory), "--force"]) == 2
    assert capsys.readouterr().err == f"jaxformer results: error: [Errno 21] Is a directory: '{directory}'\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dd", "out"] and not any(directory.iterdir())
    with pytest.raises(FileNotFoundError) as raised:  # an error about another file (one the writer reads) is kept
        write_atomically(tmp_path / "y.png", lambda handle: open(tmp_path / "font.ttf", "rb"))
    assert raised.value.filename == str(tmp_path / "font.ttf") and sorted(p.name for p in tmp_path.iterdir()) == ["dd", "out"]


def test_a_seq_len_set_by_a_hyperparameter_keeps_each_run_on_its_budget(tmp_path):
    """hyperparameters: {train.seq_len: 128} over a base of 32: the budget's tokens were counted at the base's FLOPs
    per token, so every exact-FLOPs run overshot its budget (C2e09-N5176: 3.39e9 of 2e9; 1.28-1.70x). Each run's
    tokens now follow from its own sequence length: its C is its budget to within half an optimizer step."""
    from jaxformer.accounting import training_flops_per_token
    from jaxformer.train.config import config_from_dict

    spec = load_spec(variant(tmp_path, "long", isoflop={"budgets": [1e9, 2e9], "params": [8e3, 16e3]},
                             hyperparameters={"optimizer.lr": 3e-3, "train.seq_len": 128}))
    for run in plan_runs(spec):
        config = config_from_dict(run.config)
        per_step = training_flops_per_token(config.model, 128, "exact") * config.tokens_per_step
        assert config.train.seq_len == 128
        assert run.C == run.C_exact == pytest.approx(run.D * per_step / config.tokens_per_step)
        assert abs(run.C - run.budget) <= per_step / 2, run.name
