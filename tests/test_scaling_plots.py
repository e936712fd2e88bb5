"""`jaxformer.scaling.plots`: the fit's figures draw the table's runs and the fitted laws; `save_all` writes a set of
figures whole or not at all."""

import errno
import resource
import signal
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from jaxformer.scaling.allocation import PRESETS
from jaxformer.scaling.plots import save_all

PNG = b"\x89PNG\r\n\x1a\n"


def _figure(inches: float) -> Figure:
    figure = Figure(figsize=(inches, inches))
    figure.subplots().plot([1, 2], [3, 4])
    return figure


def _contents(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def test_a_figure_whose_write_fails_midway_leaves_none_written_and_the_old_ones_as_they_were(tmp_path):
    """Files past 50 kB cannot be written (RLIMIT_FSIZE: EFBIG, as a disk that fills): the large figure in the
    middle fails after the first was written. first.png and first.svg used to be left written (first.png replaced),
    beside the old last.svg; now every file is as it was and no temporary file is left."""
    figures = {"first": _figure(2), "large": _figure(20), "last": _figure(2)}  # PNGs of about 11 kB, 100 kB, 11 kB
    (tmp_path / "first.png").write_bytes(b"old first")
    (tmp_path / "last.svg").write_bytes(b"old last")
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, limits[1]))
    try:
        with pytest.raises(OSError) as error:
            save_all(figures, tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert (error.value.errno, error.value.filename) == (errno.EFBIG, str(tmp_path / "large.png"))
    assert _contents(tmp_path) == {"first.png": b"old first", "last.svg": b"old last"}

    written = save_all(figures, tmp_path)  # the same figures with room for them: all six, the old ones replaced
    names = [f"{name}.{ext}" for name in figures for ext in ("png", "svg")]
    assert written == [tmp_path / name for name in names]
    contents = _contents(tmp_path)
    assert sorted(contents) == sorted(names)
    assert all(contents[name].startswith(PNG) for name in names[::2])
    assert all(contents[name].startswith(b"<?xml") for name in names[1::2])


def test_a_directory_where_a_figure_goes_is_refused_before_any_figure_is_written(tmp_path):
    (tmp_path / "last.svg").mkdir()
    with pytest.raises(ValueError) as error:
        save_all({"first": _figure(2), "last": _figure(2)}, tmp_path)
    assert str(error.value) == f"{tmp_path / 'last.svg'} is a directory, where a figure goes"
    assert [path.name for path in tmp_path.iterdir()] == ["last.svg"]


def _points(collection) -> np.ndarray:
    return np.asarray(collection.get_offsets())


def _rows(points) -> np.ndarray:
    """The points in one order (the report keeps its table sorted)."""
    points = np.asarray(points)
    return points[np.lexsort(points.T[::-1])]


def test_the_figures_draw_the_tables_runs_and_the_fitted_laws():
    """What each figure draws, read back from its artists: the IsoFLOP figure's points are the table's (N, loss) at each
    budget, its curves the parabolas and its stars their minima; the contour's frontier is the law's (N_opt, D_opt)(C)
    and its dots the runs' (N, D); the residuals are log L − log L̂(N, D) of each run against C and N; the N_opt figure
    draws each approach's N_opt(C), the bootstrap's band around it and the published Chinchilla law."""
    from jaxformer.scaling.report import fit_table
    from jaxformer.scaling.synthetic import isoflop_sweep

    budgets = np.logspace(18, 21, 4)
    table = isoflop_sweep(PRESETS["chinchilla"], budgets, sizes=5, noise=0.002)
    report = fit_table(table, "all", resamples=20, seed=0)
    figures = report.figures()
    close = dict(rtol=1e-12, atol=0)

    ax, = figures["isoflop"].axes
    profiles = report.approach2.profiles
    assert [p.budget for p in profiles] == pytest.approx(budgets)
    for k, (budget, p) in enumerate(zip(budgets, profiles)):
        runs = table.budget == budget
        points, star = _points(ax.collections[2 * k]), _points(ax.collections[2 * k + 1])
        np.testing.assert_allclose(_rows(points), _rows(np.column_stack([table.N[runs], table.loss[runs]])), **close)
        np.testing.assert_allclose(star, [[p.n_opt, p.loss_opt]], **close)
        line = ax.lines[k]
        u = np.log(line.get_xdata()) - p.center
        assert line.get_xdata().min() < table.N[runs].min() and line.get_xdata().max() > table.N[runs].max()
        np.testing.assert_allclose(line.get_ydata(), p.coeffs[0] + p.coeffs[1] * u + p.coeffs[2] * u**2, rtol=1e-9)
        assert p.loss_opt == pytest.approx(np.min(p.curve(np.geomspace(p.N.min(), p.N.max(), 2001))), rel=1e-6)

    law = report.approach3.law
    ax = figures["contour"].axes[0]
    frontier = ax.lines[0]
    N, D = frontier.get_xdata(), frontier.get_ydata()
    C = law.flops(N) * D  # each point's budget: the frontier is the law's (N_opt(C), D_opt(C))
    np.testing.assert_allclose(N, law.n_opt(C), rtol=1e-9)
    np.testing.assert_allclose(D, law.d_opt(C), rtol=1e-9)
    assert C.min() < table.C.min() and C.max() > table.C.max()
    np.testing.assert_allclose(_rows(_points(ax.collections[-1])), _rows(np.column_stack([table.N, table.D])), **close)
    (n_lo, n_hi), (d_lo, d_hi) = (table.N.min() / 3, table.N.max() * 3), (table.D.min() / 3, table.D.max() * 3)
    assert ax.get_xlim() == pytest.approx((n_lo, n_hi), rel=1e-12) and ax.get_ylim() == pytest.approx((d_lo, d_hi))
    ends = law.flops(n_lo) * d_lo, law.flops(n_hi) * d_hi  # the frontier spans the corners' budgets
    assert (C[0], C[-1]) == pytest.approx(ends, rel=1e-9)
    for line, c in zip(ax.lines[1:], np.geomspace(*ends, 9)[1:-1], strict=True):  # the dashed iso-FLOP lines
        np.testing.assert_allclose(law.flops(line.get_xdata()) * line.get_ydata(), c, rtol=1e-9)

    observed = np.log(table.loss) - np.log(law.E + law.A / table.N**law.alpha + law.B / table.D**law.beta)
    rms = np.sqrt(np.mean(observed ** 2))
    assert figures["residuals"].get_suptitle() == f"Approach 3 residuals (RMS {rms:.4f})" and rms > 1e-3
    for ax, x in zip(figures["residuals"].axes[:2], (table.C, table.N)):
        assert list(ax.lines[0].get_ydata()) == [0, 0]  # the zero line
        np.testing.assert_allclose(_rows(_points(ax.collections[0])), _rows(np.column_stack([x, observed])),
                                   rtol=1e-9, atol=1e-15)

    ax, = figures["n_opt"].axes
    laws = report.laws()
    bands = report.frontier_bands(ax.lines[0].get_xdata())
    assert set(bands) == {"Approach 1", "Approach 2", "Approach 3"} and len(ax.lines) == len(laws) + 1
    envelope = _points(next(c for c in ax.collections if c.get_label() == "loss envelope"))
    fit1 = report.approach1  # its envelope thinned to 25-50 markers, from its first point
    assert 25 <= len(envelope) < 50 and tuple(envelope[0]) == (fit1.flops[0], fit1.n_opt[0])
    assert set(map(tuple, envelope)) <= set(zip(fit1.flops, fit1.n_opt))
    for line, (label, fitted) in zip(ax.lines, laws.items()):
        assert line.get_label().startswith(label)
        np.testing.assert_allclose(line.get_ydata(), fitted.n_opt(line.get_xdata()), **close)
    chinchilla = ax.lines[-1]
    assert chinchilla.get_label().startswith("Chinchilla published")
    np.testing.assert_allclose(chinchilla.get_ydata(), PRESETS["chinchilla"].n_opt(chinchilla.get_xdata()), **close)
    shaded = [c for c in ax.collections if type(c).__name__.endswith("PolyCollection")]
    C = ax.lines[0].get_xdata()
    assert C.min() == pytest.approx(table.C.min() / 3) and C.max() >= 10 * 5.76e23  # the runs' and Chinchilla's
    assert len(shaded) == 3
    for collection, label in zip(shaded, ["Approach 1", "Approach 2", "Approach 3"]):
        vertices = collection.get_paths()[0].vertices
        low, high = bands[label]
        for c, lo, hi in zip(C[::9], low[::9], high[::9]):
            ys = vertices[np.isclose(vertices[:, 0], c, rtol=1e-12), 1]
            assert (ys.min(), ys.max()) == pytest.approx((lo, hi), rel=1e-12), label


def test_the_tuning_figure_draws_each_sizes_runs_its_parabola_and_the_fitted_rule():
    """`plot_tuning` on the synthetic objective of test_sweep_tune (a parabola in ln lr, lowest at lr*(N)), with one
    run diverged: each size's line is its finite runs, the diverged one an × at the top, the refining parabola the
    objective itself (it is exactly quadratic), each ★ at lr*(N); the optima and the rule's line are lr*(N)."""
    from jaxformer.scaling.plots import plot_tuning
    from jaxformer.scaling.tuning import fit_tuning
    from test_sweep_tune import grid_table, synthetic_loss, true_lr

    sizes, grid = np.array([1e4, 1e5, 1e6]), np.geomspace(3e-4, 3e-2, 9)
    N, lr, loss = grid_table(sizes, grid)
    loss[(N == 1e5) & (lr == grid[-1])] = np.nan  # diverged
    fit = fit_tuning(N, lr, loss)
    curves, optima = plot_tuning(fit).axes[:2]
    top = np.nanmax(loss)
    lines = iter(curves.lines)
    for k, size in enumerate(sizes):
        runs = next(lines)
        finite = grid[:-1] if size == 1e5 else grid
        np.testing.assert_allclose(runs.get_xdata(), finite, rtol=1e-12)
        np.testing.assert_allclose(runs.get_ydata(), synthetic_loss(size, finite), rtol=1e-12)
        parabola = next(lines)
        assert fit.optima[k].refined and parabola.get_xdata()[0] < true_lr(size) < parabola.get_xdata()[-1]
        np.testing.assert_allclose(parabola.get_ydata(), synthetic_loss(size, parabola.get_xdata()), rtol=1e-9)
        diverged, star = _points(curves.collections[2 * k]), _points(curves.collections[2 * k + 1])
        assert diverged.tolist() == ([[grid[-1], top]] if size == 1e5 else [])
        np.testing.assert_allclose(star, [[true_lr(size), 2.0]], rtol=1e-9)
    np.testing.assert_allclose(_points(optima.collections[0]), np.column_stack([sizes, true_lr(sizes)]), rtol=1e-9)
    assert len(_points(optima.collections[1])) == 0  # no optimum at a grid edge
    rule, = optima.lines
    assert rule.get_xdata()[0] < sizes[0] and rule.get_xdata()[-1] > sizes[-1]
    np.testing.assert_allclose(rule.get_ydata(), true_lr(rule.get_xdata()), rtol=1e-9)
