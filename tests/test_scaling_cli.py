"""`jaxformer fit` / `jaxformer allocate` end to end (in-process), plots, bad input → exit 2, and the fit's
programs served from the persistent compilation cache to a later process."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxformer.cli import main
from jaxformer.runtime import CACHE_DIR_ENV, enable_compilation_cache
from jaxformer.scaling.allocation import PRESETS
from jaxformer.scaling.synthetic import isoflop_sweep
from jaxformer.sweep.table import write_sweep

CHINCHILLA = Path(__file__).resolve().parents[2] / "shared" / "data" / "chinchilla_svg_extracted.csv"


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_fit_json_then_allocate_from_it(tmp_path, capsys):
    rc, out, _ = run(capsys, "fit", str(CHINCHILLA), "--exclude-highest-loss", "5", "--approach", "3",
                     "--bootstrap", "0", "--json")
    assert rc == 0
    fit = json.loads(out)
    assert fit["runs"] == 240
    assert fit["approach3"]["params"]["E"] == pytest.approx(1.8172, rel=0.01)
    assert fit["approach3"]["a"] == pytest.approx(0.514, abs=0.002)
    assert fit["approach3"]["tokens_per_param"]["5.76e+23"] == pytest.approx(17.9, abs=0.5)
    assert fit["approach3"]["convergence"]["starts"] == 4500
    (tmp_path / "fit.json").write_text(out)
    rc, out, _ = run(capsys, "allocate", "--flops", "5.76e23", "--law", str(tmp_path / "fit.json"), "--json")
    assert rc == 0
    row = json.loads(out)["allocation"][0]
    assert row["tokens_per_param"] == pytest.approx(17.9, abs=0.5)
    assert row["N_opt"] * row["D_opt"] * 6 == pytest.approx(5.76e23)


def test_allocate_preset_table(capsys):
    rc, out, _ = run(capsys, "allocate", "--flops", "1e21", "5.76e23")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("law: chinchilla (E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)")
    N = PRESETS["chinchilla"].n_opt(5.76e23)
    assert f"{N:10.4g}" in lines[3]


def test_fit_all_approaches_on_a_sweep_directory_with_plots(tmp_path, capsys):
    sweep = write_sweep(isoflop_sweep(PRESETS["chinchilla"], np.logspace(18, 21, 7), noise=0.002), tmp_path / "s")
    rc, out, err = run(capsys, "fit", str(sweep), "--bootstrap", "0", "--json", "--plots", str(tmp_path / "fig"))
    assert rc == 0, err
    fit = json.loads(out)
    a = PRESETS["chinchilla"].a
    assert fit["approach3"]["a"] == pytest.approx(a, abs=0.01)
    assert fit["approach2"]["power_laws"]["a"] == pytest.approx(a, abs=0.01)
    for budget in fit["approach2"]["budgets"]:  # each minimum spends its budget: C = 6·N_opt·D_opt
        assert 6 * budget["N_opt"] * budget["D_opt"] == pytest.approx(budget["C"], rel=1e-12)
        assert budget["N_opt"] == pytest.approx(float(PRESETS["chinchilla"].n_opt(budget["C"])), rel=0.1)
    assert fit["approach1"]["power_laws"]["a"] == pytest.approx(a, abs=0.03)
    for name in ("isoflop", "contour", "n_opt", "residuals"):
        png, svg = tmp_path / "fig" / f"{name}.png", tmp_path / "fig" / f"{name}.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in svg.read_bytes()[:500]
    assert not list((tmp_path / "fig").glob(".*"))  # no temporary files left


def test_fit_all_skips_an_approach_the_sweep_cannot_support_and_keeps_the_others(tmp_path, capsys):
    """Two sizes per budget make no IsoFLOP parabola: `--approach all` (the default) fits Approaches 3 and 1 and
    notes why Approach 2 was skipped, as the sweep's own closing fit does; it used to exit 2 on Approach 2's error,
    so a small sweep got no fit at all from `jaxformer fit DIR`."""
    law = PRESETS["chinchilla"]
    sweep = write_sweep(isoflop_sweep(law, np.logspace(18, 21, 4), sizes=2, noise=0.002), tmp_path / "s")
    rc, out, err = run(capsys, "fit", str(sweep), "--bootstrap", "0", "--json")
    assert rc == 0, err
    fit = json.loads(out)
    assert "approach2" not in fit and fit["runs"] == 8
    assert fit["approach3"]["a"] == pytest.approx(law.a, abs=0.01)
    assert 0 < fit["approach1"]["power_laws"]["a"] < 1  # two sizes per budget: an envelope, if a coarse one
    assert fit["notes"] == ["Approach 2 skipped: Approach 2 needs IsoFLOP profiles (3+ sizes) at 2 or more budgets, "
                            "got 0 (none); budget C=1e+18: 2 distinct sizes, need 3 for a parabola; skipped; budget "
                            "C=1e+19: 2 distinct sizes, need 3 for a parabola; skipped; budget C=1e+20: 2 distinct "
                            "sizes, need 3 for a parabola; skipped; budget C=1e+21: 2 distinct sizes, need 3 for a "
                            "parabola; skipped"]
    rc, out, err = run(capsys, "fit", str(sweep), "--bootstrap", "0", "--approach", "2")
    assert rc == 2 and out == "" and "Approach 2 needs IsoFLOP profiles" in err


def test_fit_text_summary_with_intervals(tmp_path, capsys):
    sweep = write_sweep(isoflop_sweep(PRESETS["chinchilla"], np.logspace(18, 21, 5), sizes=7), tmp_path / "s")
    rc, out, _ = run(capsys, "fit", str(sweep), "--approach", "2", "--bootstrap", "200", "--level", "0.9")
    assert rc == 0
    match = re.search(r"\n  a +([\d.]+) +SE ([\d.e-]+) +90% CI \[([\d.]+), ([\d.]+)\]", out)
    value, se, low, high = map(float, match.groups())
    assert low < PRESETS["chinchilla"].a < high and low < value < high and 0 < se < 0.02
    # a 90% interval: the 5th and 95th percentiles of the same resamples (a 95% one passed the checks above)
    from jaxformer.scaling.report import fit_table
    from jaxformer.sweep.table import sweep_table

    samples = fit_table(sweep_table(sweep), "2", resamples=200, seed=0).approach2.samples["a"]
    digits = len(match.group(3).split(".")[1])
    assert [low, high] == pytest.approx(np.percentile(samples, [5, 95]), abs=0.6 * 10.0 ** -digits)


@pytest.mark.parametrize(
    "table, extra, message",
    [
        ("N,D\n1e8,1e9\n", [], "no loss column"),
        ("N,D,loss\n1e8,1e9,0\n", [], "column 'loss' row 0: 0.0 is not positive and finite"),
        ("N,D,loss\n1e8,inf,3\n", [], "column 'D' row 0: inf is not positive and finite"),
        ("N,D,loss\n1e8,1e9,3\n2e8,1e9,2.9\n3e8,1e9,2.8\n", ["--approach", "3"],
         "more runs than its 5 parameters, got 3"),
        ("N,C,loss\n1e8,1e19,3\n2e8,1e19,2.9\n3e8,1e19,2.95\n", ["--approach", "2"],
         r"2 or more budgets, got 1 \(C=1e\+19\)"),
        ("N,D,loss\n1e8,1e9,3\n", ["--n-col", "params"], "column 'params' not found"),
        # one resample: Approach 3 was skipped with a note and Approach 2 printed intervals of nan, exit 0
        ("N,D,loss\n1e8,1e9,3\n", ["--bootstrap", "1"],
         r"bootstrap resamples must be 0 \(no intervals\) or at least 2, got 1"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, table, extra, message):
    path = tmp_path / "runs.csv"
    path.write_text(table)
    rc, out, err = run(capsys, "fit", str(path), *extra)
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("jaxformer fit: error: ")
    assert re.search(message, err)


def test_allocate_bad_input(tmp_path, capsys):
    rc, _, err = run(capsys, "allocate", "--flops", "0")
    assert rc == 2 and err.strip() == "jaxformer allocate: error: flops must be positive and finite, got 0.0"
    law = tmp_path / "law.json"
    law.write_text(json.dumps({"approach2": {}}))
    rc, _, err = run(capsys, "allocate", "--flops", "1e20", "--law", str(law), "--approach", "3")
    assert rc == 2 and "no approach 3 fit in it (has: 2)" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_a_second_fit_in_a_fresh_process_loads_the_compiled_solver_and_a_damaged_entry_is_rebuilt(tmp_path):
    law = PRESETS["chinchilla"]
    N = np.geomspace(1e8, 1e10, 4).repeat(4)
    D = np.tile(np.geomspace(1e9, 1e11, 4), 4)
    loss = law.loss(N, D) * np.exp(0.003 * np.random.default_rng(0).standard_normal(len(N)))
    table = tmp_path / "runs.csv"
    table.write_text("N,D,loss\n" + "".join(f"{n},{d},{l}\n" for n, d, l in zip(N, D, loss)))
    cache = tmp_path / "xla"
    env = {**os.environ, CACHE_DIR_ENV: str(cache), "JAX_LOG_COMPILES": "1"}
    fit = [sys.executable, "-m", "jaxformer.cli", "fit", str(table), "--approach", "3", "--bootstrap", "0", "--json"]

    def run_fit():
        return subprocess.run(fit, env=env, capture_output=True, text=True, timeout=300, check=True)

    compiled = "Finished XLA compilation of jit(_run)"

    first = run_fit()
    assert compiled in first.stderr
    stored = list(cache.glob("jaxformer-*.exe"))
    assert len(stored) == 1 and len(list(cache.glob("jit__run-*-cache"))) == 1  # ours, and JAX's own entry
    second = run_fit()
    assert "jit(_run)" not in second.stderr  # neither traced, nor lowered, nor looked up in JAX's cache
    assert json.loads(second.stdout) == json.loads(first.stdout)  # the stored program computes the same fit

    stored[0].write_bytes(b"damaged")
    third = run_fit()
    assert "ignoring stored program" in third.stderr and compiled in third.stderr
    assert json.loads(third.stdout) == json.loads(first.stdout) and stored[0].stat().st_size > 1000


def test_a_compilation_cache_every_user_may_write_is_left_unused(tmp_path, capsys):
    """Its entries run as native code, and fit unpickles its own: in a directory anyone may write (one under /tmp,
    say, or /tmp itself) another user could plant one, so it is not used, with one note."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    before = jax.config.jax_compilation_cache_dir
    assert enable_compilation_cache(shared) is None and jax.config.jax_compilation_cache_dir == before
    assert capsys.readouterr().err.startswith(f"note: compilation cache {shared} is writable by every user, so")


def test_no_solver_program_is_kept_while_jaxs_cache_is_turned_off(tmp_path):
    """``JAX_ENABLE_COMPILATION_CACHE=false`` turns JAX's cache off with its directory still set: the fit keeps no
    program of its own there either."""
    from jaxformer.scaling.programs import cache_directory

    directory, enabled = jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        assert cache_directory() == tmp_path
        jax.config.update("jax_enable_compilation_cache", False)
        assert cache_directory() is None
    finally:
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_enable_compilation_cache", enabled)


def test_fit_approach2_wild_bootstrap_on_the_long_study(capsys):
    """`--approach2-resample wild` on the long study at beta2 0.99 (experiments/cpu_chinchilla_ladder_beta2_wide_icx):
    the command's interval is the library's on the same table and seed, and narrower than the pooled residuals'
    [0.545, 0.662] (experiments/approach2_intervals/, session 31)."""
    from jaxformer.scaling.isoflop import fit_isoflop
    from jaxformer.scaling.table import load_table

    results = Path(__file__).resolve().parents[1] / "experiments" / "cpu_chinchilla_ladder_beta2_wide_icx" / "results.csv"
    rc, out, err = run(capsys, "fit", str(results), "--approach", "2", "--approach2-resample", "wild",
                       "--bootstrap", "1000", "--json")
    assert rc == 0, err
    a = json.loads(out)["approach2"]["bootstrap"]["a"]
    library = fit_isoflop(load_table(results).canonical(), resamples=1000, seed=0, resample="wild").stats["a"]
    assert a["ci"] == pytest.approx([library.low, library.high], rel=1e-12)
    assert a["value"] == pytest.approx(0.6129, abs=1e-4) and a["ci"] == pytest.approx([0.577, 0.665], abs=0.005)


def test_a_law_whose_loss_rises_with_n_has_no_allocation_and_says_so(tmp_path, capsys):
    """Loss rising with N (here 2.1 at N = 10 to 2.7 at 1e7, D 1e6 or 2e6) fits alpha < 0: the law has no
    compute-optimal split, so G and the tokens per parameter are nan and a line says why (the power of a negative
    base was complex)."""
    table = tmp_path / "rising.csv"
    table.write_text("N,D,loss\n" + "".join(f"1e{k},{1 + k % 2}e6,{2.0 + 0.1 * k:.1f}\n" for k in range(1, 8)))
    code, out, err = run(capsys, "fit", str(table), "--bootstrap", "0", "--approach", "3")
    assert code == 0, err
    assert float(re.search(r"\n  alpha\s+(\S+)", out).group(1)) < 0
    assert re.search(r"\n  G\s+nan\n", out) and re.search(r"tokens_per_param@\S+\s+nan", out)
    assert "no compute-optimal allocation: the fitted loss does not fall with both N and D" in out


def _sweep_csv(path: Path, budgets=np.logspace(18, 21, 5), curves: bool = False) -> Path:
    """A synthetic IsoFLOP sweep as a table file: one row per run, or per evaluation (long form) with ``curves``."""
    t = isoflop_sweep(PRESETS["chinchilla"], budgets, sizes=7, curve_points=10)
    if curves:
        rows = [f"r{r},{t.N[r]},{tokens},{loss},{t.budget[r]}"
                for r, tokens, loss in zip(t.curve_run, t.curve_tokens, t.curve_loss)]
        path.write_text("run,params,tokens,loss,budget\n" + "\n".join(rows) + "\n")
    else:
        path.write_text("params,tokens,loss,budget\n" + "".join(f"{n},{d},{l},{b}\n"
                                                              for n, d, l, b in zip(t.N, t.D, t.loss, t.budget)))
    return path


@pytest.mark.parametrize(
    "option, message",
    [
        (["--level", "1.5"], "argument --level: must be a finite number above 0 and below 1, got 1.5"),
        (["--level", "0"], "argument --level: must be a finite number above 0 and below 1, got 0"),
        (["--seed", "-1"], "argument --seed: must be an integer at least 0, got -1"),
        (["--bootstrap", "1000000000000"], r"argument --bootstrap: must be an integer in \[0, 100000\], got 1000000000000"),
    ],
)
def test_bad_options_exit_2_before_the_fit(tmp_path, capsys, option, message):
    with pytest.raises(SystemExit) as exited:
        main(["fit", str(_sweep_csv(tmp_path / "runs.csv")), *option])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.splitlines()) == 1 and re.search(message, err), err


@pytest.mark.parametrize(
    "rows, message",
    [
        (["1e8,2e9,3.1"] * 8, r"more distinct \(N, D\) points than its 5 parameters, got 1 in 8 runs"),
        ([f"1e8,{d},{3 + 1 / (i + 1)}" for i, d in enumerate(np.logspace(9, 11, 8))], "runs at 2 or more sizes N"),
        ([f"{n},{d},3.0" for n, d in zip(np.logspace(7, 9, 8), np.logspace(9, 11, 8)[::-1])],
         "losses that differ between runs, got 3 in every run"),
    ],
)
def test_runs_that_cannot_determine_approach_3_exit_2(tmp_path, capsys, rows, message):
    path = tmp_path / "runs.csv"
    path.write_text("params,tokens,loss\n" + "\n".join(rows) + "\n")
    rc, out, err = run(capsys, "fit", str(path), "--bootstrap", "50")
    assert rc == 2 and out == "" and len(err.splitlines()) == 1 and re.search(message, err), err


def test_plots_that_cannot_be_written_are_refused_before_the_fit_or_leave_no_figure(tmp_path, capsys, monkeypatch):
    """--plots naming a file stops before the fit; a directory where a figure goes is found after the fit, whose
    results are printed first, and before any figure is written (isoflop.png and .svg used to be left behind)."""
    table = _sweep_csv(tmp_path / "runs.csv")
    (tmp_path / "file").write_text("")
    with monkeypatch.context() as patched:
        patched.setattr("jaxformer.commands.fit.fit_table", lambda *a, **k: pytest.fail("the fit ran"))
        rc, out, err = run(capsys, "fit", str(table), "--plots", str(tmp_path / "file" / "figs"))
    assert rc == 2 and out == "" and err == f"jaxformer fit: error: --plots {tmp_path}/file/figs: {tmp_path}/file is a " \
                                            "file, not a directory\n"
    figures = tmp_path / "figs"
    (figures / "n_opt.png").mkdir(parents=True)
    rc, out, err = run(capsys, "fit", str(table), "--approach", "2", "--bootstrap", "0", "--plots", str(figures))
    assert rc == 2 and err == f"jaxformer fit: error: {figures}/n_opt.png is a directory, where a figure goes\n"
    assert "Approach 2 (IsoFLOP parabolas)" in out
    assert sorted(p.name for p in figures.iterdir()) == ["n_opt.png"]


def test_excluding_the_highest_losses_of_a_long_form_table_keeps_approach_1(tmp_path, capsys):
    table = _sweep_csv(tmp_path / "curves.csv", curves=True)
    rc, out, err = run(capsys, "fit", str(table), "--approach", "1", "--bootstrap", "0", "--exclude-highest-loss", "1",
                       "--json")
    assert rc == 0, err
    fit = json.loads(out)
    assert fit["runs"] == 34 and fit["approach1"]["power_laws"]["a"] == pytest.approx(PRESETS["chinchilla"].a, abs=0.03)


def test_close_budgets_get_a_key_each(tmp_path, capsys):
    rc, out, err = run(capsys, "fit", str(_sweep_csv(tmp_path / "runs.csv", budgets=[1e19, 1.004e19, 1e20, 1e21])),
                       "--approach", "2", "--bootstrap", "20", "--json")
    assert rc == 0, err
    stats = json.loads(out)["approach2"]["bootstrap"]
    assert {"N_opt@1e+19", "N_opt@1.004e+19", "N_opt@1e+20", "N_opt@1e+21"} <= set(stats)


def test_a_point_outside_its_interval_is_one_warning_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("jaxformer.scaling.report.FitReport.outside_intervals",
                        lambda self: ["Approach 2: a 0.381 [1.5, 1.5]", "Approach 2: b 0.619 [-0.5, -0.5]"])
    rc, out, err = run(capsys, "fit", str(_sweep_csv(tmp_path / "runs.csv")), "--approach", "2", "--bootstrap", "20")
    assert rc == 0 and err == ("warning: point estimates outside their 95% bootstrap intervals (the resamples mostly "
                               "ended at another optimum): Approach 2: a 0.381 [1.5, 1.5]; Approach 2: b 0.619 "
                               "[-0.5, -0.5]\n")


@pytest.mark.parametrize(
    "law, message",
    [
        ({"E": 1, "A": 1e10, "B": 1, "alpha": 0.01, "beta": 0.01},  # G = 1e500
         r"law.json \(law\): no finite compute-optimal allocation at 1e\+21 FLOPs \(N_opt inf, D_opt 0\)"),
        ({"approach3": {"params": PRESETS["epoch"].to_dict()}, "flops_per_token": {"k": "6", "p": 1}},
         "law.json: flops_per_token.k must be a number, got '6'"),
        (None, "is a directory, not a JSON file"),
        ({"approach3": {"law": PRESETS["epoch"].to_dict()}},
         r"law.json: approach3.params is missing or not an object \(`jaxformer fit --json` writes it\)"),
    ],
)
def test_allocate_refuses_a_law_without_a_finite_allocation_in_one_line(tmp_path, capsys, law, message):
    path = tmp_path / "law.json"
    path.mkdir() if law is None else path.write_text(json.dumps(law))
    rc, out, err = run(capsys, "allocate", "--flops", "1e21", "--law", str(path), "--json")
    assert rc == 2 and out == "" and len(err.splitlines()) == 1 and re.search(message, err), err


def test_allocate_below_one_parameter_warns_and_prints_short_numbers(capsys):
    rc, out, err = run(capsys, "allocate", "--flops", "1e-300")
    assert rc == 0
    assert err == ("warning: at 1e-300 FLOPs the optimum is N_opt 1.965e-136, D_opt 8.482e-166: under one parameter, "
                   "so no model trains on this budget\n")
    assert out.splitlines()[2].split() == ["1e-300", "1.965e-136", "8.482e-166", "4.317e-30", "1.2429e+49"]


def test_the_fit_notebook_removes_its_temporary_directory():
    """The notebook's synthetic sweep goes to a TemporaryDirectory that its last cell removes (mkdtemp left one)."""
    import nbformat

    notebook = nbformat.read(Path(__file__).resolve().parents[1] / "notebooks" / "fit_scaling_laws.ipynb", as_version=4)
    code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    assert not any("mkdtemp" in source for source in code)
    assert any("workspace = tempfile.TemporaryDirectory()" in source for source in code)
    assert code[-1].rstrip().endswith("workspace.cleanup()")
