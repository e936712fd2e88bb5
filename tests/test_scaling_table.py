"""Loading runs: CSV / Parquet / JSONL / sweep directories, column detection, bad input."""

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxformer.scaling.allocation import PRESETS
from jaxformer.scaling.synthetic import isoflop_sweep
from jaxformer.sweep.table import sweep_table, write_sweep
from jaxformer.scaling.table import RunTable, load_table

CHINCHILLA = Path(__file__).resolve().parents[2] / "shared" / "data" / "chinchilla_svg_extracted.csv"


def test_chinchilla_extraction_loads_as_is():
    t = load_table(CHINCHILLA)
    assert len(t) == 245
    with CHINCHILLA.open() as fh:
        first = next(csv.DictReader(fh))
    assert t.N[0] == float(first["Model Size"])
    assert t.C[0] == float(first["Training FLOP"])
    assert t.loss[0] == float(first["loss"])
    np.testing.assert_allclose(t.D, t.C / (6 * t.N))
    assert t.budget is None and not t.has_curves
    kept = t.exclude_highest_loss(5)
    assert len(kept) == 240 and kept.loss.max() < 3.45 < t.loss.max()


def _records():
    return [{"params": 1e8, "tokens": 2e9, "val_loss": 3.1}, {"params": 2e8, "tokens": 4e9, "val_loss": 2.9},
            {"params": 4e8, "tokens": 8e9, "val_loss": 2.7}]


def test_csv_parquet_jsonl_give_the_same_table(tmp_path):
    records = _records()
    with (tmp_path / "runs.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "runs.parquet")
    tables = [load_table(tmp_path / f"runs.{ext}") for ext in ("csv", "jsonl", "parquet")]
    for t in tables:
        np.testing.assert_array_equal(t.N, [1e8, 2e8, 4e8])
        np.testing.assert_array_equal(t.D, [2e9, 4e9, 8e9])
        np.testing.assert_allclose(t.C, 6 * t.N * t.D)
        np.testing.assert_array_equal(t.loss, [3.1, 2.9, 2.7])


def test_explicit_column_names(tmp_path):
    path = tmp_path / "odd.csv"
    path.write_text("size,seen,xent,loss\n1e8,2e9,3.0,9.9\n2e8,4e9,2.8,9.9\n")
    t = load_table(path, n_col="size", d_col="seen", loss_col="xent")
    np.testing.assert_array_equal(t.loss, [3.0, 2.8])


def test_sweep_directory_with_budgets_and_curves(tmp_path):
    source = isoflop_sweep(PRESETS["chinchilla"], [1e18, 1e19], sizes=5, curve_points=6)
    t = sweep_table(write_sweep(source, tmp_path / "sweep"))
    assert len(t) == 10
    np.testing.assert_allclose(np.sort(t.N), np.sort(source.N))
    assert sorted(set(t.budget)) == [1e18, 1e19]
    assert t.has_curves and len(t.curve_loss) == 60
    order = np.argsort(t.N)
    np.testing.assert_allclose(t.loss[order], source.loss[np.argsort(source.N)])


def test_a_runs_curve_is_its_evaluations_as_training_logs_them(tmp_path):
    """metrics.jsonl as `jaxformer train` writes it: logged steps with a train_loss and no val_loss between the
    evaluations, and an evaluation whose loss is NaN; only the finite evaluations are curve points."""
    source = isoflop_sweep(PRESETS["chinchilla"], [1e18], sizes=2, curve_points=3)
    directory = write_sweep(source, tmp_path / "sweep")
    for run_dir in sorted((directory / "runs").iterdir()):
        evaluations = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        rows = []
        for row in evaluations:
            rows.append({"step": row["step"], "tokens": row["tokens"] / 2, "train_loss": 9.0})
            rows.append({**row, "train_loss": 8.0})
        rows.append({"step": 99, "tokens": 1e12, "train_loss": 7.0, "val_loss": float("nan")})
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    table = sweep_table(directory)
    order = np.argsort(table.curve_run, kind="stable")
    np.testing.assert_array_equal(table.curve_run[order], np.repeat([0, 1], 3))
    for r in range(2):
        original = int(np.flatnonzero(source.N == table.N[r])[0])
        mine, theirs = table.curve_run == r, source.curve_run == original
        np.testing.assert_allclose(table.curve_tokens[mine], source.curve_tokens[theirs])
        np.testing.assert_allclose(table.curve_loss[mine], source.curve_loss[theirs])


def test_a_parameter_count_it_does_not_know_is_refused_by_name(tmp_path):
    directory = write_sweep(isoflop_sweep(PRESETS["chinchilla"], [1e18], sizes=2), tmp_path / "sweep")
    with pytest.raises(ValueError, match=r"params must be one of total, non_embedding .* got 'embedding' and None"):
        sweep_table(directory, params="embedding")


def test_a_sweeps_budgets_are_counted_by_the_rule_it_planned_them_with(tmp_path):
    """A sweep planned in 6ND FLOPs is read with C = 6ND by default; exact FLOPs are refused, since under them the
    runs of one budget no longer share a compute (the two counts' ratio depends on N)."""
    directory = write_sweep(isoflop_sweep(PRESETS["chinchilla"], [1e18, 1e19], sizes=5), tmp_path / "sweep")
    plan = json.loads((directory / "plan.json").read_text())
    for run in plan["runs"]:
        run["flops_rule"] = "6ND"
        final = directory / "runs" / run["name"] / "final.json"
        record = json.loads(final.read_text())
        record["flops_exact"] = record["flops_6nd"] * (1 + 1e4 / record["params"])  # attention and head: more per N
        final.write_text(json.dumps(record))
    (directory / "plan.json").write_text(json.dumps(plan))
    table = sweep_table(directory)
    assert "C: flops_6nd" in table.source and sorted(set(table.budget)) == [1e18, 1e19]
    with pytest.raises(ValueError, match=r"--flops exact: .* planned its IsoFLOP budgets in 6ND FLOPs"):
        sweep_table(directory, flops="exact")
    for run in plan["runs"]:  # a grid: no budgets to keep, so either count of its runs' compute may be fitted
        run["budget"] = None
    (directory / "plan.json").write_text(json.dumps(plan))
    exact = sweep_table(directory, flops="exact")
    assert "C: flops_exact" in exact.source and exact.budget is None and np.all(exact.C > table.C)


def test_long_form_table_is_curves(tmp_path):
    path = tmp_path / "curves.csv"
    rows = ["run,N,tokens,loss"] + [f"r{i},{n},{d},{4 - 0.1 * i - 0.01 * j}" for i, n in enumerate([1e7, 2e7])
                                    for j, d in enumerate([1e8, 2e8, 4e8])]
    path.write_text("\n".join(rows) + "\n")
    t = load_table(path)
    assert len(t) == 2 and t.has_curves
    np.testing.assert_array_equal(t.D, [4e8, 4e8])  # final point = most tokens
    np.testing.assert_allclose(t.loss, [3.98, 3.88])


def test_results_table_keeps_finished_runs(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("run,status,N,D,C,budget,loss\na,done,1e7,1e8,6e15,6e15,3.0\nb,failed,2e7,5e7,6e15,6e15,\n")
    t = load_table(path)
    assert len(t) == 1 and t.budget[0] == 6e15


@pytest.mark.parametrize(
    "text, message",
    [
        ("N,tokens,loss\n1e8,2e9,-3.0\n", "column 'loss' row 0: -3.0 is not positive and finite"),
        ("N,tokens,loss\n1e8,2e9,nan\n", "column 'loss' row 0: nan is not positive and finite"),
        ("N,tokens,loss\n1e8,0,3.0\n", "column 'tokens' row 0: 0.0 is not positive and finite"),
        ("N,tokens,loss\n1e8,2e9,abc\n", "column 'loss' row 0: 'abc' is not a number"),
        ("N,tokens\n1e8,2e9\n", "no loss column"),
        ("N,loss\n1e8,3.0\n", "no tokens \\(D\\) or FLOPs \\(C\\) column"),
    ],
)
def test_bad_tables_raise_one_line(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        load_table(path)
    assert "\n" not in str(info.value)


def test_missing_explicit_column_and_unknown_format(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("N,D,loss\n1,2,3\n")
    with pytest.raises(ValueError, match="column 'flops' not found"):
        load_table(path, c_col="flops")
    (tmp_path / "t.xlsx").write_text("")
    with pytest.raises(ValueError, match="unknown table format '.xlsx'"):
        load_table(tmp_path / "t.xlsx")
    with pytest.raises(FileNotFoundError):
        load_table(tmp_path / "missing.csv")


def test_from_arrays_needs_d_or_c():
    with pytest.raises(ValueError, match="need tokens D or FLOPs C"):
        RunTable.from_arrays([1e8], [3.0])


def test_a_fit_does_not_depend_on_the_order_of_the_runs():
    """A sweep directory and its results.csv list the runs in different orders; the fits must be identical."""
    from jaxformer.scaling.report import fit_table, jsonable

    table = isoflop_sweep(PRESETS["chinchilla"], np.logspace(18, 20, 3), sizes=5, noise=0.01, curve_points=5)
    shuffled = np.random.default_rng(0).permutation(len(table))
    rank = np.empty_like(shuffled)
    rank[shuffled] = np.arange(len(shuffled))
    listed = table.subset(shuffled).with_curves(rank[table.curve_run], table.curve_tokens, table.curve_loss)
    assert not np.array_equal(listed.N, table.N)
    fits = [jsonable(fit_table(t, "all", resamples=20).to_dict()) for t in (table, listed)]
    for fit in fits:
        fit.pop("source")
    assert fits[0] == fits[1]
    np.testing.assert_array_equal(listed.canonical().N, table.canonical().N)


def test_a_grouped_bootstrap_does_not_depend_on_the_order_of_the_runs():
    """The same runs and groups listed in another order draw the same groups: a sweep's fit reads its run
    directories by name, its results.csv lists them in plan order (the main job's Approach 3 interval came out
    [0.529, 0.686] from one and [0.545, 0.676] from the other while the groups were numbered in the input order)."""
    from jaxformer.scaling.report import fit_table, jsonable

    table = isoflop_sweep(PRESETS["chinchilla"], np.logspace(18, 20, 3), sizes=5, noise=0.01)
    labels = [round(float(n)) for n in table.N]  # one group per size, over the budgets: a WSD trunk's branches
    reversed_ = np.arange(len(table))[::-1]
    listed = table.subset(reversed_).with_groups([labels[i] for i in reversed_])
    fits = [jsonable(fit_table(t, "all", resamples=20, resample2="wild").to_dict())
            for t in (table.with_groups(labels), listed)]
    for fit in fits:
        fit.pop("source")
    assert fits[0]["approach3"]["bootstrap"]["groups"] == len(set(labels)) > 1
    assert fits[0] == fits[1]


def test_a_byte_order_mark_is_not_part_of_the_first_column_name(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes("params,tokens,loss\n1e6,2e7,3\n2e6,2e7,2.9\n".encode("utf-8-sig"))
    t = load_table(path)
    np.testing.assert_array_equal(t.N, [1e6, 2e6])
    np.testing.assert_array_equal(t.loss, [3.0, 2.9])


@pytest.mark.parametrize(
    "name, text, message",
    [
        # the row as the file numbers its data rows, not as counted among the finished runs
        ("results.csv", "params,tokens,loss,status\n1e6,2e7,,failed\n1e6,2e7,,running\n2e6,2e7,-3,done\n",
         "column 'loss' row 2: -3.0 is not positive and finite"),
        ("results.csv", "params,tokens,loss,status\n1e6,2e7,,failed\n2e6,x,3,done\n", "column 'tokens' row 1: 'x' is not"),
        ("runs.jsonl", '{"params": 1e6, "tokens": 2e7, "loss": 3}\n{"params": true, "tokens": 2e7, "loss": 3}\n',
         "column 'params' row 1: True is not a number"),
        ("runs.csv", "params,tokens,params,loss\n1e6,2e7,2e6,3\n", "the header names column 'params' twice"),
        ("runs.csv", "params,tokens,loss\n1e6,2e7,3\n1e308,1e308,3\n",
         r"C = 6ND is inf for N=1e\+308, D=1e\+308: out of floating-point range"),
        ("runs.csv", "params,flops,loss\n1e300,1e-30,3\n", r"D = C/\(6N\) is 0.0 for C=1e-30, N=1e\+300"),
    ],
)
def test_bad_rows_and_headers_raise_one_line_naming_them(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        load_table(path)
    assert "\n" not in str(info.value)


def test_excluding_runs_keeps_the_other_runs_curves(tmp_path):
    """`--exclude-highest-loss` on a long-form table: the kept runs keep their curve points, renumbered, so
    Approach 1 still has curves (it used to be skipped, "the runs carry no training curves")."""
    source = isoflop_sweep(PRESETS["chinchilla"], [1e18, 1e19], sizes=5, curve_points=6)
    kept = source.exclude_highest_loss(2)
    dropped = np.argsort(source.loss)[-2:]
    assert len(kept) == 8 and kept.has_curves and len(kept.curve_loss) == 8 * 6
    for r in range(len(kept)):
        original = int(np.flatnonzero((source.N == kept.N[r]) & (source.D == kept.D[r]))[0])
        assert original not in dropped
        np.testing.assert_array_equal(kept.curve_loss[kept.curve_run == r], source.curve_loss[source.curve_run == original])
        np.testing.assert_array_equal(kept.curve_tokens[kept.curve_run == r],
                                      source.curve_tokens[source.curve_run == original])


def test_excluding_the_k_highest_losses_drops_exactly_those_and_k_stays_below_the_run_count():
    table = RunTable.from_arrays([1e6, 2e6, 4e6, 8e6], [3.0, 3.4, 2.9, 3.2], D=[1e7] * 4)
    assert table.exclude_highest_loss(0) is table
    np.testing.assert_array_equal(table.exclude_highest_loss(1).loss, [3.0, 2.9, 3.2])  # in their order
    np.testing.assert_array_equal(table.exclude_highest_loss(3).N, [4e6])
    for k in (-1, 4):
        with pytest.raises(ValueError, match=rf"^exclude_highest_loss must be in \[0, 3\], got {k}$"):
            table.exclude_highest_loss(k)


@pytest.mark.parametrize("text", ["params,tokens,loss\n", "params,tokens,loss,status\n1e6,2e7,,failed\n"])
def test_a_table_without_rows_or_finished_runs_has_no_rows(tmp_path, text):
    path = tmp_path / "results.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        load_table(path)
    assert str(error.value) == f"{path}: the table has no rows"


def test_a_long_form_table_of_flops_has_curves_in_tokens_and_one_n_per_run(tmp_path):
    """Without a tokens column each evaluation's tokens are its FLOPs over 6N; a run whose rows disagree on N, by one
    parameter even, is refused."""
    path = tmp_path / "curves.csv"
    path.write_text("run,N,flops,loss\na,1000,6e6,4.0\na,1000,1.2e7,3.5\nb,2000,1.2e7,3.8\nb,2000,2.4e7,3.3\n")
    t = load_table(path)
    np.testing.assert_array_equal(t.D, [2000.0, 2000.0])
    np.testing.assert_array_equal(t.curve_tokens, [1000.0, 2000.0, 1000.0, 2000.0])
    path.write_text("run,N,flops,loss\na,1000,6e6,4.0\na,1001,1.2e7,3.5\nb,2000,1.2e7,3.8\n")
    with pytest.raises(ValueError, match="run 'a' has more than one N"):
        load_table(path)


def test_the_canonical_order_keeps_each_runs_budget_with_it():
    table = RunTable.from_arrays([4e6, 1e6, 2e6], [3.0, 3.2, 3.1], C=[1e15, 2e15, 3e15], budget=[1e15, 2e15, 3e15])
    canonical = table.canonical()
    np.testing.assert_array_equal(canonical.N, [1e6, 2e6, 4e6])
    np.testing.assert_array_equal(canonical.budget, canonical.C)
