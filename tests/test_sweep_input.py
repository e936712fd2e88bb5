"""A sweep's input, refused in one line naming the field and value before any run (``fit:``, a budget under one
token, a size beyond the shape rule), the dry run's table, and the results command's ``--output``, all in this
process and without training."""

import re

import numpy as np
import pytest
import yaml

from jaxformer.cli import main
from jaxformer.files import write_atomically
from jaxformer.models.presets import get_preset
from jaxformer.sweep.directory import prepare_directory, write_plan
from jaxformer.sweep.launch import plan_table
from jaxformer.sweep.plan import SHAPE_FIELDS, plan_runs
from jaxformer.sweep.planned_fields import SIZE_FIELDS
from jaxformer.sweep.sizing import ShapeRule, shape_for_params
from jaxformer.sweep.spec import CenterSpec, load_spec
from sweep_helpers import TINY, variant

_ISO = {"budgets": [1e9, 2e9], "params": [8e3, 16e3], "flops": "6ND"}
_CENTER = {"n_opt": 1e4, "budget": 1e9}
_FIT3 = {"approaches": [2, 3]}


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
    # the edge: a budget of one step's tokens plans one step; under half a step rounds to none and is refused
    one_step = 6 * 8_240 * 256
    runs = plan_runs(load_spec(variant(tmp_path, "one-step", isoflop={"budgets": [one_step], "params": [8e3],
                                                                      "flops": "6ND"})))
    assert [(run.steps, run.D) for run in runs] == [(1, 256)]
    half = variant(tmp_path, "half-step", isoflop={"budgets": [one_step * 0.49], "params": [8e3], "flops": "6ND"})
    assert main(["sweep", str(half), "--dry-run", "--no-probe"]) == 2
    assert "125 tokens is less than one step of 256 tokens" in capsys.readouterr().err


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


def test_a_size_below_the_smallest_shape_is_refused_from_just_past_the_tolerance():
    base, rule = get_preset("tiny"), ShapeRule(head_dim=8, max_layers=2)
    smallest = 3_096  # one layer of one head of width 8
    within = shape_for_params(smallest / (1 + rule.tolerance) * 1.001, base, rule)  # over by just under 15%
    assert (within.num_layers, within.num_heads) == (1, 1)
    with pytest.raises(ValueError) as error:
        shape_for_params(smallest / (1 + rule.tolerance) * 0.999, base, rule)
    assert str(error.value) == ("shape rule gives too few layers for params=2689: one layer of width 8 already "
                                "holds 3,096 parameters")
    with pytest.raises(ValueError) as error:
        shape_for_params(100, base, ShapeRule(head_dim=8, min_layers=2, max_layers=2))
    assert str(error.value) == ("shape rule gives too few layers for params=100: 2 layers (shape.min_layers) of width "
                                "8 already holds 4,136 parameters")


def test_shape_rule_fields_at_their_edges():
    base = get_preset("tiny")
    fixed = shape_for_params(20e3, base, ShapeRule(head_dim=8, min_layers=3, max_layers=3))  # one depth allowed
    assert fixed.num_layers == 3
    for field, value in (("head_dim", 0), ("max_layers", 0), ("max_heads", 0), ("aspect_ratio", 0.0)):
        with pytest.raises(ValueError, match=re.escape(f"shape.{field} must be positive, got {value}")):
            ShapeRule(**{field: value})
    assert ShapeRule(aspect_ratio=0.5).aspect_ratio == 0.5
    for target in (0.0, -8e3, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=re.escape(f"target params must be a positive number, got {target}")):
            shape_for_params(target, base, ShapeRule())


def test_the_dry_run_table_keeps_wide_values_apart(tmp_path):
    spec = load_spec(variant(tmp_path, "wide", isoflop={"budgets": [1e15], "params": [8e3], "flops": "6ND"}))
    runs = plan_runs(spec)
    header, row = plan_table(runs, workers=1, probe=False).splitlines()[:2]
    run = runs[0]
    assert row.split() == [run.name, f"{run.N:,}", f"{run.D:.3g}", f"{run.C:.3g}", f"{run.tokens_per_param:.1f}",
                           f"{run.steps:,}"]
    ends = [[match.end() for match in re.finditer(r"\S+", line)] for line in (header, row)]
    assert ends[1][1:] == ends[0][1:6]  # each value right-aligned under its heading
    assert float(row.split()[4]) == pytest.approx(1e15 / (6 * 8_240 ** 2), rel=1e-4)  # tokens per parameter, C/(6N²)


def test_the_dry_run_estimates_each_run_from_one_probe_per_shape(monkeypatch):
    """A run's minutes are the probe's compile plus its steps at the probe's pace (a measurement replaced here by
    fixed timings, 1.2 s to compile and 10 ms or 0.6 s a step): to a tenth of a minute, or two digits under it."""
    from jaxformer.train import throughput

    probed = []

    def timing(config, *, steps):
        probed.append((config.model.num_layers, config.model.d_model, steps))
        return throughput.StepTiming(1.2, 0.01 if config.model.num_layers == 1 else 0.6, 256, 1e6)

    monkeypatch.setattr(throughput, "time_train_step", timing)
    runs = plan_runs(load_spec(TINY))  # 79 and 158 steps at N = 8,240 (1 × 16), 39 and 79 at 16,496 (3 × 16)
    lines = plan_table(runs, workers=2, probe=True).splitlines()
    assert sorted(probed) == [(1, 16, 3), (3, 16, 3)]
    minutes = {line.split()[0]: line.split()[-1] for line in lines[1:5]}
    assert minutes == {"C1e09-N8240-s0": "0.033", "C1e09-N16496-s0": "0.4", "C2e09-N8240-s0": "0.046",
                       "C2e09-N16496-s0": "0.8"}  # (1.2 + 79 × 0.01) / 60, (1.2 + 39 × 0.6) / 60 …
    assert lines[5].endswith(", about 1.3 run-minutes: ETA ≈ 0.6 min on 2 workers")


def test_the_dry_run_says_what_adapt_may_add_and_which_runs_train_together(tmp_path):
    repeat = {"budget": 1e9, "seeds": [5, 6]}  # three seeds at 1e9, one at 2e9
    spec = load_spec(variant(tmp_path, "seeds", seeds=[0], isoflop={**_ISO, "repeat": repeat}))
    lines = plan_table(plan_runs(spec), workers=2, probe=False, adapt_limit=2, together=True).splitlines()
    assert lines[-2] == ("adapt: on, up to 2 more sizes per budget beyond the edge where its minimum lies (at most 8 "
                         "more runs, about 1e+10 FLOPs), trained after these")  # 2 × (3 + 1) seeds; 2 × (3e9 + 2e9)
    assert lines[-1] == "together: 8 runs in 4 worker requests, each group one program (2 of 3 runs)"
    two = load_spec(variant(tmp_path, "two", seeds=[0, 1], isoflop={**_ISO, "repeat": {"budget": 1e9, "seeds": [5]}}))
    assert plan_table(plan_runs(two), workers=2, probe=False, together=True).splitlines()[-1] == (
        "together: 10 runs in 4 worker requests, each group one program (4 of 2–3 runs)")
    assert plan_table(plan_runs(load_spec(TINY)), workers=2, probe=False, together=True).splitlines()[-1] == (
        "together: no runs of the 4 can share a program (none differ only in lr schedule or seed)")


def test_formulas_see_the_budget_as_c_and_its_tokens_as_d(tmp_path):
    """Under ``flops: 6ND`` a budget's C is 6·N·D of the run's wanted tokens D (before whole steps round them)."""
    spec = variant(tmp_path, "c-and-d", hyperparameters={"optimizer.lr": "1e-3 * C / (6 * N * D)",
                                                         "optimizer.weight_decay": "C / 1e10"})
    runs = plan_runs(load_spec(spec))
    assert [run.config["optimizer"]["lr"] for run in runs] == pytest.approx([1e-3] * 4, rel=1e-12)
    assert [run.config["optimizer"]["weight_decay"] for run in runs] == pytest.approx([0.1, 0.1, 0.2, 0.2])


def test_two_runs_of_one_name_are_refused_naming_the_repeated_one(tmp_path, capsys):
    spec = variant(tmp_path, "twice", isoflop={"budgets": [1e9], "params": [8e3, 16e3, 16.3e3], "flops": "6ND"})
    assert main(["sweep", str(spec), "--dry-run", "--no-probe"]) == 2
    assert capsys.readouterr().err == ("jaxformer sweep: error: two runs of the sweep have the same shape and budget "
                                       "(C1e09-N16496-s0): the size rule mapped two targets to one model (list sizes "
                                       "further apart, or change shape)\n")


def test_a_text_corpus_that_would_repeat_is_noted_with_its_training_split_in_bytes(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("x" * 40_000)  # byte-level: one token a byte, a twentieth held out
    base = {**yaml.safe_load(TINY.read_text())["base"], "data": {"corpus": f"files:{tmp_path}/*.txt"}}
    spec = variant(tmp_path, "small-text", base=base, isoflop={"budgets": [4e9], "params": [8e3], "flops": "6ND"})
    assert main(["sweep", str(spec), "--dry-run", "--no-probe"]) == 0
    assert "note: 1 of 1 runs see the training split (about 3.8e+04 tokens) more than once" in capsys.readouterr().out


def test_a_hyperparameter_that_changes_only_the_flops_of_the_shaped_model_is_refused_naming_it(tmp_path, capsys):
    """A sliding window keeps N and shrinks the attention FLOPs: the budget's tokens would follow from FLOPs per token
    of a model that does not train."""
    spec = variant(tmp_path, "window", hyperparameters={"checkpoint.interval": 20, "model.sliding_window": 8})
    assert main(["sweep", str(spec), "--dry-run", "--no-probe"]) == 2
    assert capsys.readouterr().err.startswith(
        "jaxformer sweep: error: hyperparameters.model.sliding_window: changes the model the size rule shaped for "
        "params=8e+03 (N 8,240, trained 8,240)")


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


@pytest.mark.parametrize("tolerance", [5, 1, 0, -0.1])
def test_a_shape_tolerance_outside_0_to_1_is_refused_in_one_line(tmp_path, capsys, tolerance):
    """shape.tolerance is how far from its target, as a fraction of it, a shape's count may lie: 5 was accepted and
    planned a target of 16e3 as N = 21,600 (35% off), and at 1 or more `shape_for_params` can refuse no size as
    out of reach."""
    spec = variant(tmp_path, "tolerance", shape={"head_dim": 16, "aspect_ratio": 16, "tolerance": tolerance})
    assert main(["sweep", str(spec), "--dry-run", "--no-probe"]) == 2
    assert capsys.readouterr().err == ("jaxformer sweep: error: shape.tolerance must be a fraction of the target size "
                                       f"between 0 and 1 (0.15: within 15%), got {float(tolerance)}\n")
    assert ShapeRule(tolerance=0.5).tolerance == 0.5


@pytest.mark.parametrize("model, message", [
    # each of these was replaced by the size rule's value without a word (d_ff 512 trained as 64)
    ({"d_ff": 512, "num_layers": 6}, "base.model.d_ff: the sweep sets it for every run (each run's FFN width follows "
                                     "its d_model: 4·d_model, or 8/3·d_model for a gated activation); remove it"),
    ({"num_layers": 6}, "base.model.num_layers: the sweep sets it for every run (the size rule gives each run its "
                        "depth, from shape.min_layers to shape.max_layers: set both to fix it); remove it"),
    ({"d_model": 64}, "base.model.d_model: the sweep sets it for every run (the size rule gives each run its width, "
                      "shape.head_dim × its heads); remove it"),
    ({"head_dim": 8}, "base.model.head_dim: the sweep sets it for every run (each run's head width is shape.head_dim)"),
    ({"num_heads": 8}, "base.model.num_heads: the sweep sets it for every run (the size rule gives each run its heads; "
                       "with model.num_kv_heads beside it, their ratio, the query heads per K/V head, is kept)"),
    ({"num_experts": 4, "expert_d_ff": 32}, "base.model.expert_d_ff: the sweep sets it for every run"),
])
def test_a_size_field_in_the_base_model_is_refused_naming_it(tmp_path, capsys, model, message):
    base = {**yaml.safe_load(TINY.read_text())["base"], "model": {"preset": "tiny", **model}}
    spec = variant(tmp_path, "sized", base=base)
    assert main(["sweep", str(spec), "--dry-run", "--no-probe"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxformer sweep: error: {message}") and len(err.splitlines()) == 1, err
    assert set(SIZE_FIELDS) == {f"model.{field}" for field in SHAPE_FIELDS} - {"model.num_kv_heads"}


def test_query_heads_per_kv_head_given_in_the_base_are_kept_by_the_size_rule(tmp_path):
    """num_heads beside num_kv_heads is their ratio, which the size rule keeps (`jaxformer.sweep.sizing`)."""
    base = {**yaml.safe_load(TINY.read_text())["base"], "model": {"preset": "tiny", "num_heads": 4, "num_kv_heads": 1}}
    (run,) = plan_runs(load_spec(variant(tmp_path, "grouped", base=base,
                                         isoflop={"budgets": [1e11], "params": [2e5], "flops": "6ND"})))
    assert (run.config["model"]["num_heads"], run.config["model"]["num_kv_heads"]) == (4, 1)


def test_a_dry_run_into_a_directory_the_launch_refuses_prints_the_plan_and_says_why(tmp_path, capsys):
    """A dry run said nothing of an --out the launch then refused (another sweep's, runs begun under other settings,
    a file); it now prints the plan, then the launch's refusal in one line, exits 2 and writes nothing."""
    out, spec = tmp_path / "out", load_spec(TINY)
    other = load_spec(variant(tmp_path, "other", isoflop={"budgets": [1e9], "params": [8e3], "flops": "6ND"}))
    prepare_directory(other, plan_runs(other), out)
    with pytest.raises(ValueError) as launched:  # what the launch says before it writes
        prepare_directory(spec, plan_runs(spec), out)
    written = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    plan = plan_table(plan_runs(spec), workers=1, probe=False) + "\n"
    assert main(["sweep", str(TINY), "--dry-run", "--no-probe", "--out", str(out)]) == 2
    assert capsys.readouterr() == (plan, f"jaxformer sweep: error: the launch would refuse: {launched.value}\n")
    assert str(launched.value) == f"--out {out} holds a different sweep (its plan.json lists other runs); use a new " \
                                  "--out"
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == written

    mine = tmp_path / "mine"  # this sweep's directory, one run finished
    prepare_directory(spec, plan_runs(spec), mine)
    (mine / "runs" / plan_runs(spec)[0].name).mkdir(parents=True)
    (mine / "runs" / plan_runs(spec)[0].name / "final.json").write_text('{"val_loss": 3.25}')
    assert main(["sweep", str(TINY), "--dry-run", "--no-probe", "--out", str(mine)]) == 0
    assert capsys.readouterr() == (plan, "")
    changed = variant(tmp_path, "tiny", hyperparameters={"optimizer.lr": 1e-3})
    assert main(["sweep", str(changed), "--dry-run", "--no-probe", "--out", str(mine)]) == 2
    lr = plan_runs(spec)[0].config["optimizer"]["lr"]  # 3e-3 · 0.824^-0.25
    assert capsys.readouterr().err == (f"jaxformer sweep: error: the launch would refuse: --out {mine} holds runs "
                                       f"begun under other settings (C1e09-N8240-s0: optimizer.lr was {lr}, now "
                                       "0.001); relaunch with the spec they were begun with, or use a new --out\n")
    (tmp_path / "file").write_text("x")
    assert main(["sweep", str(TINY), "--dry-run", "--no-probe", "--out", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err == (f"jaxformer sweep: error: the launch would refuse: --out {tmp_path / 'file'} "
                                       "is not a directory\n")


def test_a_spec_kept_as_its_sweeps_spec_yaml_is_left_as_written(tmp_path):
    """`jaxformer sweep DIR/spec.yaml --out DIR`: the launch's record of the spec is the user's own file, comments
    (and a tune: section, which the record would replace by its rule) kept; elsewhere the record is written."""
    out = tmp_path / "out"
    out.mkdir()
    text = "# why these budgets: see the notes\n" + TINY.read_text()
    (out / "spec.yaml").write_text(text)
    spec = load_spec(out / "spec.yaml")
    prepare_directory(spec, plan_runs(spec), out, spec_file=str(out / "spec.yaml"))
    assert (out / "spec.yaml").read_text() == text and (out / "plan.json").is_file()
    prepare_directory(spec, plan_runs(spec), tmp_path / "elsewhere", spec_file=str(out / "spec.yaml"))
    assert load_spec(tmp_path / "elsewhere" / "spec.yaml") == spec


@pytest.mark.parametrize("changes, message", [
    ({"grid": {"params": [8e3], "tokens": [1e5]}}, "a sweep needs exactly one of 'isoflop' or 'grid'"),
    ({"isoflop": None}, "a sweep needs exactly one of 'isoflop' or 'grid'"),
    ({"isoflop": {**_ISO, "budgets": [1e9, 0.0]}}, "isoflop.budgets must hold positive numbers, got 0.0"),
    ({"isoflop": {**_ISO, "params": [8e3, -1.0]}}, "isoflop.params must hold positive numbers, got -1.0"),
    ({"isoflop": None, "grid": {"params": [8e3], "tokens": [-1e5]}},
     "grid.tokens must hold positive numbers, got -100000.0"),
    ({"isoflop": None, "grid": {"params": [8e3], "tokens": []}}, "the sweep's size and budget lists must not be empty"),
    ({"isoflop": {**_ISO, "budgets": []}}, "the sweep's size and budget lists must not be empty"),
    ({"isoflop": {**_ISO, "params": []}},
     "isoflop needs exactly one of params (a list of sizes) or center (sizes per budget)"),
    ({"isoflop": {**_ISO, "center": _CENTER}},
     "isoflop needs exactly one of params (a list of sizes) or center (sizes per budget)"),
    ({"isoflop": {"budgets": [1e9], "center": {**_CENTER, "n_opt": 0.0}}},
     "isoflop.center.n_opt must be positive, got 0.0"),
    ({"isoflop": {"budgets": [1e9], "center": {**_CENTER, "budget": -1e9}}},
     "isoflop.center.budget must be positive, got -1000000000.0"),
    ({"isoflop": {"budgets": [1e9], "center": {**_CENTER, "span": -2.0}}},
     "isoflop.center.span must be positive, got -2.0"),
    ({"isoflop": {"budgets": [1e9], "center": {**_CENTER, "sizes": 0}}},
     "isoflop.center.sizes must be positive, got 0"),
    ({"seeds": []}, "seeds must list at least one seed"),
    ({"seeds": [0, -1]}, "seeds must be non-negative (each run's train.seed), got [0, -1]"),
    ({"isoflop": {**_ISO, "repeat": {"budget": 1e9, "seeds": [-2]}}},
     "isoflop.repeat.seeds must be non-negative (each run's train.seed), got [-2]"),
    ({"isoflop": {**_ISO, "repeat": {"budget": 3e9}}},
     "isoflop.repeat.budget must be one of isoflop.budgets, got 3e+09"),
    ({"verify": {}}, "verify needs a fit with Approach 3 (fit.approaches), whose law predicts the loss"),
    ({"fit": {"approaches": [2]}, "verify": {}},
     "verify needs a fit with Approach 3 (fit.approaches), whose law predicts the loss"),
    ({"fit": {"approaches": [1, 3]}, "verify": {"approach": 1}},
     "verify.approach must be 2 or 3 and among fit.approaches, got 1"),
    ({"fit": {"approaches": [3]}, "verify": {"approach": 2}},
     "verify.approach must be 2 or 3 and among fit.approaches, got 2"),
    ({"fit": _FIT3, "verify": {"factor": 0.0}}, "verify.factor must be positive, got 0.0"),
    ({"fit": _FIT3, "verify": {"budget": -1e12}}, "verify.budget must be positive, got -1000000000000.0"),
    ({"fit": _FIT3, "verify": {"sizes": [0.5, 2.0]}},
     "verify.sizes must be positive multiples of N_opt including 1, got [0.5, 2.0]"),
    ({"fit": _FIT3, "verify": {"sizes": [1.0, -2.0]}},
     "verify.sizes must be positive multiples of N_opt including 1, got [1.0, -2.0]"),
    ({"fit": _FIT3, "verify": {"sizes": [1.0, 0.0]}},
     "verify.sizes must be positive multiples of N_opt including 1, got [1.0, 0.0]"),
    ({"fit": _FIT3, "verify": {"seeds": []}}, "verify.seeds must list one or more distinct seeds, got []"),
    ({"fit": _FIT3, "verify": {"seeds": [3, 3]}}, "verify.seeds must list one or more distinct seeds, got [3, 3]"),
    ({"fit": _FIT3, "verify": {"seeds": [-1]}},
     "verify.seeds must be non-negative (each run's train.seed), got [-1]"),
    ({"hyperparameters": {"trainer.lr": 1e-3}}, "hyperparameters.trainer.lr: not a training config field"),
    ({"hyperparameters": {"optimizer": 1e-3}}, "hyperparameters.optimizer: each key names one field, dotted, with a "
                                               "number or formula (e.g. optimizer.lr: \"3e-3 * (N / 1e4) ** -0.25\"), "
                                               "not a section"),
    ({"hyperparameters": {"optimizer.lr": {"peak": 1e-3}}}, "hyperparameters.optimizer.lr: each key names one field, "
                                                            "dotted, with a number or formula (e.g. optimizer.lr: "
                                                            "\"3e-3 * (N / 1e4) ** -0.25\"), not a section"),
])
def test_each_bad_spec_section_is_refused_at_load_naming_its_field(tmp_path, changes, message):
    with pytest.raises(ValueError) as error:
        load_spec(variant(tmp_path, "bad", **changes))
    assert str(error.value) == message


def test_sizes_centred_on_a_prior_law_are_log_spaced_over_the_span_and_one_size_is_the_centre(tmp_path):
    center = CenterSpec(n_opt=1e4, budget=1e9, span=16.0, sizes=5)
    assert center.step == 2.0
    np.testing.assert_allclose(center.targets(1e9), [2.5e3, 5e3, 1e4, 2e4, 4e4], rtol=1e-12)
    np.testing.assert_allclose(center.targets(4e9), [5e3, 1e4, 2e4, 4e4, 8e4], rtol=1e-12)  # N_opt ∝ C^0.5
    assert CenterSpec(n_opt=1e4, budget=1e9, sizes=1).targets(1e9) == [1e4]
    one = load_spec(variant(tmp_path, "one", isoflop={"budgets": [1e9], "center": {**_CENTER, "sizes": 1}}))
    assert one.isoflop.targets(4e9) == [2e4]
    adapt = {"budgets": [1e9], "center": {**_CENTER, "sizes": 3, "span": 1.5}, "adapt": True}
    assert load_spec(variant(tmp_path, "narrow", isoflop=adapt)).isoflop.center.step == pytest.approx(1.5 ** 0.5)


def test_a_verify_section_of_distinct_seeds_and_sizes_with_1_loads(tmp_path):
    verify = load_spec(variant(tmp_path, "verify", fit=_FIT3, verify={"seeds": [0, 1], "sizes": [0.5, 1]})).verify
    assert (verify.seeds, verify.sizes, verify.factor, verify.approach) == ([0, 1], [0.5, 1.0], 3.0, 3)
    inside = load_spec(variant(tmp_path, "inside", fit=_FIT3, verify={"factor": 0.5})).verify  # between the budgets
    assert inside.factor == 0.5
