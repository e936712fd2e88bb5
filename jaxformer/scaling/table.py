"""Tables of training runs → arrays: CSV, Parquet, JSONL, or columns in memory.

A run has a parameter count N, training tokens D, training FLOPs C (either of D and C may be
missing: D = C / 6N, C = 6ND) and a final loss; optionally an IsoFLOP budget label and a
loss curve (tokens seen → loss). Column names are found automatically (``Model Size`` /
``Training FLOP`` / ``loss`` of the Chinchilla extraction, ``params`` / ``tokens`` /
``flops`` / ``val_loss`` of a sweep…) or given explicitly.

A table in *long* form (a run column whose values repeat, one row per evaluation) holds
curves: each run's final point is its row with the most tokens. Rows whose ``status``
column (as in ``jaxformer results``) is not ``done`` are left out.

This module knows no training layout: a sweep hands its runs over as a table
(`jaxformer.sweep.table.sweep_table`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from jaxformer.files import load_jsonl
from jaxformer.scaling.allocation import SIX_ND

# role -> accepted names, compared after lower-casing and mapping spaces/dashes to "_"
CANDIDATES: dict[str, tuple[str, ...]] = {
    "N": ("n", "params", "model_size", "n_params", "num_params", "parameters"),
    "D": ("d", "tokens", "training_tokens", "n_tokens", "num_tokens", "train_tokens"),
    "C": ("c", "flops", "training_flop", "training_flops", "compute", "train_flops", "flops_6nd"),
    "loss": ("loss", "val_loss", "final_loss", "eval_loss", "validation_loss"),
    "budget": ("budget", "flops_budget", "isoflop", "isoflop_budget"),
    "run": ("run", "run_id", "run_name"),
}


@dataclass(frozen=True)
class RunTable:
    """One row per run; arrays ``[Y]``. ``curve_*`` are ``[points]`` of the runs' curves."""

    N: np.ndarray
    D: np.ndarray
    C: np.ndarray
    loss: np.ndarray
    budget: np.ndarray | None = None  # IsoFLOP budget label per run (FLOPs), if the table has one
    group: np.ndarray | None = None  # bootstrap cluster per run (0 … G−1): runs drawn together, e.g. one trunk's branches
    curve_run: np.ndarray | None = None  # index into the runs
    curve_tokens: np.ndarray | None = None
    curve_loss: np.ndarray | None = None
    source: str = "arrays"

    def __len__(self) -> int:
        return len(self.N)

    @property
    def has_curves(self) -> bool:
        return self.curve_run is not None

    @classmethod
    def from_arrays(cls, N, loss, D=None, C=None, budget=None, source: str = "arrays") -> "RunTable":
        """Builds and validates a table; give D or C (or both)."""
        cols = {"N": N, "loss": loss, "D": D, "C": C, "budget": budget}
        arrays = {k: _positive(k, np.asarray(v, dtype=np.float64).ravel(), source)
                  for k, v in cols.items() if v is not None}
        if "D" not in arrays and "C" not in arrays:
            raise ValueError(f"{source}: need tokens D or FLOPs C for every run, got neither")
        lengths = {k: len(v) for k, v in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"{source}: columns have different lengths {lengths}")
        n = arrays["N"]
        with np.errstate(over="ignore", under="ignore"):
            d = arrays["D"] if "D" in arrays else arrays["C"] / SIX_ND(n)
            c = arrays["C"] if "C" in arrays else SIX_ND(n) * d
        _derived("D = C/(6N)", d, {"C": c, "N": n}, source)
        _derived("C = 6ND", c, {"N": n, "D": d}, source)
        return cls(n, d, c, arrays["loss"], arrays.get("budget"), source=source)

    def with_curves(self, run: np.ndarray, tokens: np.ndarray, loss: np.ndarray) -> "RunTable":
        tokens = _positive("curve tokens", np.asarray(tokens, np.float64), self.source)
        loss = _positive("curve loss", np.asarray(loss, np.float64), self.source)
        return replace(self, curve_run=np.asarray(run, np.int64), curve_tokens=tokens, curve_loss=loss)

    def with_groups(self, labels) -> "RunTable":
        """The table with a bootstrap cluster per run: runs with equal ``labels`` (any hashable values, one per
        run) are resampled together (`jaxformer.scaling.bootstrap.resample_counts`)."""
        labels = list(labels)
        if len(labels) != len(self):
            raise ValueError(f"{self.source}: {len(labels)} group labels for {len(self)} runs")
        index = {label: i for i, label in enumerate(dict.fromkeys(labels))}
        return replace(self, group=np.array([index[label] for label in labels], np.int64))

    def canonical(self) -> "RunTable":
        """The same runs ordered by (N, D, loss), their curve points by (run, tokens), their bootstrap groups
        numbered in that order: a fit of this table does not depend on the order its runs were listed in
        (floating-point sums, and so flat optima, do; a grouped bootstrap draws groups by their numbers)."""
        order = np.lexsort((self.loss, self.D, self.N))
        pick = lambda a: None if a is None else a[order]  # noqa: E731
        group = None
        if self.group is not None:  # renumbered by first appearance in the new order, as with_groups numbers them
            _, first, inverse = np.unique(self.group[order], return_index=True, return_inverse=True)
            group = np.argsort(np.argsort(first))[inverse].astype(np.int64)
        table = replace(self, N=self.N[order], D=self.D[order], C=self.C[order], loss=self.loss[order],
                        budget=pick(self.budget), group=group)
        if not self.has_curves:
            return table
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        run = rank[self.curve_run]
        points = np.lexsort((self.curve_tokens, run))
        return replace(table, curve_run=run[points], curve_tokens=self.curve_tokens[points],
                       curve_loss=self.curve_loss[points])

    def subset(self, index: np.ndarray) -> "RunTable":
        """The runs at ``index`` (distinct positions), with their curves' points (renumbered to the new positions)."""
        index = np.asarray(index, np.int64)
        pick = lambda a: None if a is None else a[index]  # noqa: E731
        table = RunTable(self.N[index], self.D[index], self.C[index], self.loss[index], pick(self.budget),
                         source=self.source)
        table = table if self.group is None else table.with_groups(self.group[index])
        if not self.has_curves:
            return table
        position = np.full(len(self), -1)
        position[index] = np.arange(len(index))
        kept = position[self.curve_run] >= 0
        return replace(table, curve_run=position[self.curve_run[kept]], curve_tokens=self.curve_tokens[kept],
                       curve_loss=self.curve_loss[kept])

    def exclude_highest_loss(self, k: int) -> "RunTable":
        """Drops the k runs with the highest loss (Besiroglu et al. drop 5 outliers)."""
        if k < 0 or k >= len(self):
            raise ValueError(f"exclude_highest_loss must be in [0, {len(self) - 1}], got {k}")
        if k == 0:
            return self
        return self.subset(np.sort(np.argsort(self.loss, kind="stable")[: len(self) - k]))


def _first_bad(values: np.ndarray) -> int | None:
    """The index of the first value that is not positive and finite; None when they all are."""
    bad = np.flatnonzero(~(np.isfinite(values) & (values > 0)))
    return int(bad[0]) if bad.size else None


def _positive(name: str, values: np.ndarray, source: str, rows: np.ndarray | None = None) -> np.ndarray:
    """``values``, checked positive and finite; a bad one raises one line naming its row (``rows[i]``: the file's
    data row of value i, default i)."""
    i = _first_bad(values)
    if i is not None:
        raise ValueError(f"{source}: column {name!r} row {i if rows is None else rows[i]}: {float(values[i])!r} "
                         "is not positive and finite")
    return values


def _derived(name: str, values: np.ndarray, inputs: dict[str, np.ndarray], source: str) -> None:
    """A column computed from others (``name`` its formula) must be positive and finite: not overflowed to inf or
    underflowed to 0."""
    i = _first_bad(values)
    if i is not None:
        given = ", ".join(f"{k}={float(v[i]):g}" for k, v in inputs.items())
        raise ValueError(f"{source}: {name} is {float(values[i])!r} for {given}: out of floating-point range")


def _norm(name: str) -> str:
    return name.strip().lower().replace(" ", "_").replace("-", "_")


def find_column(columns: list[str], role: str, explicit: str | None, source: str, required: bool = True) -> str | None:
    """The column playing ``role``: ``explicit`` if given (must exist), else the first candidate."""
    if explicit is not None:
        if explicit not in columns:
            raise ValueError(f"{source}: column {explicit!r} not found (columns: {', '.join(columns)})")
        return explicit
    by_norm = {_norm(c): c for c in columns}
    for candidate in CANDIDATES[role]:
        if candidate in by_norm:
            return by_norm[candidate]
    if required:
        tried = ", ".join(CANDIDATES[role])
        raise ValueError(f"{source}: no {role} column (tried {tried}; columns: {', '.join(columns)})")
    return None


def _numbers(name: str, values: list, source: str, rows: np.ndarray) -> np.ndarray:
    """``values`` as floats; a bool or a value that is not a number raises one line naming its row (``rows[i]``:
    the file's data row of value i)."""
    out = np.empty(len(values))
    for i, v in enumerate(values):
        try:
            if isinstance(v, bool):
                raise TypeError
            out[i] = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{source}: column {name!r} row {rows[i]}: {v!r} is not a number") from None
    return out


def _read_columns(path: Path) -> dict[str, list]:
    try:
        return _columns_of(path)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (not UTF-8), so not a table") from None
    except csv.Error as error:  # a cell past the csv module's field size limit (128 KiB), a NUL inside quotes …
        raise ValueError(f"{path}: not a CSV table ({error})") from None


def _columns_of(path: Path) -> dict[str, list]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8-sig") as fh:  # -sig: a byte-order mark is not the first name's
            reader, rows = csv.DictReader(fh), []
            _distinct(reader.fieldnames or [], path)
            for row in reader:
                if None in row:  # DictReader's key for the cells past the header's
                    raise ValueError(f"{path}, line {reader.line_num}: {len(reader.fieldnames) + len(row[None])} "
                                     f"cells, but the header names {len(reader.fieldnames)} columns")
                rows.append(row)
        return {k: [r[k] for r in rows] for k in (rows[0].keys() if rows else [])}
    if suffix in (".jsonl", ".ndjson"):
        return records_to_columns(load_jsonl(path), path)
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # imported here: only Parquet users pay for it

        table = pq.read_table(path)
        _distinct(table.column_names, path)
        return table.to_pydict()
    raise ValueError(f"{path}: unknown table format {suffix!r} (use .csv, .parquet or .jsonl)")


def _distinct(names: Sequence[str], source) -> None:
    """A header that names one column twice raises one line naming it."""
    twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
    if twice is not None:
        raise ValueError(f"{source}: the header names column {twice!r} twice")


def records_to_columns(records: list[dict], source) -> dict[str, list]:
    """Columns of a list of JSON records (a key missing from a record is NaN there)."""
    names: list[str] = []
    for r in records:
        if not isinstance(r, dict):
            raise ValueError(f"{source}: every record must be a JSON object, got {r!r}")
        names += [k for k in r if k not in names]
    return {k: [r.get(k, math.nan) for r in records] for k in names}


def columns_table(cols: dict[str, list], source: str, group_by: Sequence[str] = (), **names: str | None) -> RunTable:
    """A ``RunTable`` from named columns; ``names`` (``N=``, ``D=``, ``C=``, ``loss=``, ``budget=``,
    ``run=``) pick columns explicitly, the others are found by name (`CANDIDATES`). ``group_by``: columns
    whose values together label each run's bootstrap cluster (`RunTable.with_groups`; one row per run)."""
    columns = list(cols)
    rows = np.arange(max(map(len, cols.values()), default=0))  # each row's number among the file's data rows
    if "status" in cols:  # a `jaxformer results` table: only finished runs have losses
        rows = np.array([i for i, v in enumerate(cols["status"]) if v == "done"], np.int64)
        cols = {k: [v[i] for i in rows] for k, v in cols.items()}
    if not columns or not any(len(v) for v in cols.values()):
        raise ValueError(f"{source}: the table has no rows")
    found = {role: find_column(columns, role, names.get(role), source, required=role in ("N", "loss"))
             for role in ("N", "D", "C", "loss", "budget", "run")}
    if found["D"] is None and found["C"] is None:
        raise ValueError(f"{source}: no tokens (D) or FLOPs (C) column (columns: {', '.join(columns)})")
    num = {role: _positive(col, _numbers(col, cols[col], source, rows), source, rows)
           for role, col in found.items() if col and role != "run"}
    group_cols = [find_column(columns, "group", col, source) for col in group_by]
    run = found["run"]
    if run is None or len(set(map(str, cols[run]))) == len(cols[run]):
        table = RunTable.from_arrays(num["N"], num["loss"], num.get("D"), num.get("C"), num.get("budget"), source)
        return table.with_groups(zip(*(map(str, cols[col]) for col in group_cols))) if group_cols else table
    if group_cols:
        raise ValueError(f"{source}: bootstrap groups need one row per run, and column {run!r} repeats runs")
    return _long_form([str(v) for v in cols[run]], num, source)


def _long_form(run_ids: list[str], num: dict[str, np.ndarray], source: str) -> RunTable:
    """One row per evaluation: the final point of each run is its row with the most tokens."""
    names, index = np.unique(np.array(run_ids), return_inverse=True)
    n = num["N"]
    tokens = num["D"] if "D" in num else num["C"] / SIX_ND(n)
    finals = []
    for r in range(len(names)):
        rows = np.flatnonzero(index == r)
        if np.ptp(n[rows]) > 0:
            raise ValueError(f"{source}: run {str(names[r])!r} has more than one N")
        finals.append(rows[np.argmax(tokens[rows])])
    finals = np.array(finals)
    pick = lambda k: num[k][finals] if k in num else None  # noqa: E731
    table = RunTable.from_arrays(n[finals], num["loss"][finals], tokens[finals], pick("C"), pick("budget"), source)
    return table.with_curves(index, tokens, num["loss"])


def load_table(path: str | Path, *, n_col: str | None = None, d_col: str | None = None, c_col: str | None = None,
               loss_col: str | None = None, budget_col: str | None = None, run_col: str | None = None,
               group_by: Sequence[str] = ()) -> RunTable:
    """Reads a table file (CSV, Parquet, JSONL) into a validated ``RunTable``; ``group_by`` as `columns_table`.

    A sweep directory is read by the sweep itself (`jaxformer.sweep.table.sweep_table`).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    if path.is_dir():
        raise ValueError(f"{path} is a directory: give a table file, or read a sweep directory with "
                         "jaxformer.sweep.table.sweep_table (the `jaxformer fit` command does both)")
    return columns_table(_read_columns(path), str(path), group_by, N=n_col, D=d_col, C=c_col, loss=loss_col,
                         budget=budget_col, run=run_col)
