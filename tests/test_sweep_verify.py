"""The held-out check after a sweep's fit (``verify:``): the runs it plans and trains, the prediction it compares
them with, and its intervals for one run and for a mean over seeds."""

import json

import numpy as np
import pytest
import yaml

from jaxformer.sweep.plan import plan_runs
from jaxformer.sweep.spec import load_spec
from jaxformer.sweep.verify import measured_optimum
from sweep_helpers import jaxformer, variant


def test_pooled_seed_noise_estimates_one_runs_standard_deviation():
    """The seed noise the prediction interval uses: from 400 shapes of two seeds and 100 of five, with one run's
    relative standard deviation 1%, the pooled estimate is 1% (its standard error about 0.03%), where the median
    of the shapes' spreads would be 0.674% for the pairs; finished rows only."""
    from jaxformer.sweep.fit import pooled_seed_noise, seed_noise

    rng = np.random.default_rng(0)
    rows = [{"N": n, "D": 1.0, "status": "done", "loss": loss}
            for n, seeds in enumerate([2] * 400 + [5] * 100) for loss in 3.0 * (1 + 0.01 * rng.standard_normal(seeds))]
    pairs = [np.std([a["loss"], b["loss"]], ddof=1) / 3.0 for a, b in zip(rows[:800:2], rows[1:800:2])]
    assert np.median(pairs) == pytest.approx(0.00674, rel=0.1)
    pooled, degrees = pooled_seed_noise(rows)
    assert pooled == pytest.approx(0.01, rel=0.06) and degrees == 400 * 1 + 100 * 4
    stray = rows + [{"N": 0, "D": 1.0, "status": "failed", "loss": 30.0}]
    assert pooled_seed_noise(stray) == pooled_seed_noise(rows)
    assert pooled_seed_noise([{"N": 1, "D": 1.0, "status": "done", "loss": 3.0}]) is None
    assert seed_noise(rows).startswith("seed noise: 500 shapes trained with several seeds; the final loss's "
                                       f"standard deviation across seeds is {100 * pooled:.2f}% of its mean "
                                       "(pooled over the shapes, 800 degrees of freedom;")


def test_an_estimated_seed_noise_widens_the_prediction_interval_to_students_t():
    """The seed noise is estimated from ν degrees of freedom (one per pair of seeds), so the prediction interval's
    noise is Student's t with ν degrees of freedom: with the law's own spread small beside it, the interval's
    half-width is t(0.975, ν)·σ, 12.71σ from one pair, 2.78σ from four, 2.04σ from thirty, and 1.96σ for a σ
    taken as known. Normal noise with σ estimated from four pairs held 88% of held-out runs, not 95%."""
    from jaxformer.scaling.allocation import PRESETS
    from jaxformer.scaling.report import fit_table
    from jaxformer.scaling.synthetic import isoflop_sweep
    from jaxformer.sweep.verify import predict

    law = PRESETS["chinchilla"]
    report = fit_table(isoflop_sweep(law, np.logspace(18, 21, 7), noise=0.0005), "3", resamples=400, seed=0)
    N = float(law.n_opt(1e21))
    D = 1e21 / (6 * N)
    sigma = 0.05
    for degrees, quantile in ((None, 1.960), (1, 12.706), (4, 2.776), (30, 2.042)):
        found = predict(report, N, D, noise=sigma, noise_degrees=degrees)
        low, high = found["prediction_interval"]
        assert found["seed_noise_degrees"] == degrees
        assert (high - low) / 2 == pytest.approx(quantile * sigma * found["loss"], rel=0.05), degrees
        if degrees in (None, 30):  # the loss times 1 + noise: centred on it (a division would put it 1% above)
            assert (high + low) / 2 == pytest.approx(found["loss"], rel=0.003), degrees


def test_one_runs_prediction_interval_adds_the_seed_noise_to_the_laws():
    """The held-out check's interval for one run: each bootstrap law's loss times 1 + noise·z. Its half-width is
    the law's and the seed's combined in quadrature (normal percentiles), and without noise there is none."""
    from jaxformer.scaling.allocation import PRESETS
    from jaxformer.scaling.report import fit_table
    from jaxformer.scaling.synthetic import isoflop_sweep
    from jaxformer.sweep.verify import predict

    law = PRESETS["chinchilla"]
    report = fit_table(isoflop_sweep(law, np.logspace(18, 21, 7), noise=0.002), "3", resamples=100, seed=0)
    N = float(law.n_opt(1e22))
    D = 1e22 / (6 * N)
    assert predict(report, N, D)["prediction_interval"] is None
    found = predict(report, N, D, noise=0.02)
    (low, high), (one_low, one_high) = found["interval"], found["prediction_interval"]
    assert found["loss"] == pytest.approx(float(report.approach3.law.loss(N, D))) and found["seed_noise"] == 0.02
    law_sd = (high - low) / (2 * 1.96 * found["loss"])
    expected = 1.96 * (law_sd ** 2 + 0.02 ** 2) ** 0.5 * found["loss"]
    assert (one_high - one_low) / 2 == pytest.approx(expected, rel=0.05)
    assert one_low < low < high < one_high
    mean_low, mean_high = predict(report, N, D, noise=0.02, runs=4)["prediction_interval"]  # four seeds' mean
    expected = 1.96 * (law_sd ** 2 + 0.01 ** 2) ** 0.5 * found["loss"]
    assert (mean_high - mean_low) / 2 == pytest.approx(expected, rel=0.05)
    assert one_low < mean_low < low < high < mean_high < one_high


def test_the_measured_optimum_is_the_vertex_of_a_parabola_in_log_n_that_the_sizes_bracket():
    def held_out(sizes, curvature=1.0):
        return [{"N": n, "measured_loss": 1.0 + curvature * np.log(n / 1e5) ** 2} for n in sizes]

    assert measured_optimum(held_out([3e4, 1e5, 3e5])) == pytest.approx(1e5, rel=1e-9)
    assert measured_optimum(held_out([2e4, 7e4, 1e6])) == pytest.approx(1e5, rel=1e-9)  # uneven sizes
    assert measured_optimum(held_out([1.2e5, 3e5, 1e6])) is None  # the vertex just below the smallest size
    assert measured_optimum(held_out([2e5, 3e5, 1e6])) is None  # below every size
    assert measured_optimum(held_out([3e4, 1e5, 3e5], curvature=-1.0)) is None  # a maximum, not a minimum
    assert measured_optimum(held_out([3e4, 3e5])) is None  # two sizes fit no parabola


def test_held_out_sizes_train_at_every_seed_and_their_mean_is_judged(tmp_path):
    """A sweep with ``seeds: [0, 1]`` trains each held-out size at both seeds (``verify.seeds`` defaults to the
    sweep's) and judges their mean loss, against the prediction interval for the mean of two runs.

    Every run's final loss, the held-out ones' too, is written from a known law before the launch, so the sweep
    trains nothing and every figure in verify.json is known."""
    from jaxformer.scaling.allocation import ParametricLaw
    from jaxformer.sweep.fit import fit_sweep
    from jaxformer.sweep.results import collect
    from jaxformer.sweep.verify import plan_verify, predict

    truth = ParametricLaw(E=1.0, A=200.0, B=168.5, alpha=0.35, beta=0.35)
    path = variant(tmp_path, "two-seeds", seeds=[0, 1], isoflop={"budgets": [1e9, 2e9, 4e9],
                                                                "params": [8e3, 16e3, 32e3, 64e3], "flops": "6ND"},
                   fit={"approaches": [2, 3], "bootstrap": 20}, verify={"factor": 2, "sizes": [1, 2]})
    spec, out = load_spec(path), tmp_path / "out"
    runs = plan_runs(spec)

    def finish(run, loss):
        final = {"params": run.N, "params_non_embedding": run.N_non_embedding, "tokens": run.D,
                 "flops_exact": run.C_exact, "flops_6nd": run.C_6nd, "val_loss": loss}
        (out / "runs" / run.name).mkdir(parents=True)
        (out / "runs" / run.name / "final.json").write_text(json.dumps(final))

    for run in runs:  # seed 1 0.4% above seed 0
        finish(run, float(truth.loss(run.N, run.D)) * (1 + 0.004 * run.seed))
    unverified = tmp_path / "unverified.yaml"
    unverified.write_text(yaml.safe_dump({k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "verify"}))
    assert jaxformer("sweep", unverified, "--out", out).returncode == 0  # the sweep's plan.json, nothing to train
    _, fitted = fit_sweep(out, collect(out), spec.fit)
    held_out = plan_verify(spec, runs, fitted)
    assert [run.seed for run in held_out] == [0, 1, 0, 1]
    assert held_out[0].N == held_out[1].N < held_out[2].N == held_out[3].N  # the compute-optimal size first
    losses = {run.name: float(truth.loss(run.N, run.D)) * (1.02 if run.seed == 0 else 0.99) for run in held_out}
    for run in held_out:
        finish(run, losses[run.name])
    result = jaxformer("sweep", path, "--out", out, "--workers", 1)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verify: 4 held-out runs at C = 8e+09" in result.stdout and "0 to train" in result.stdout.split("verify:")[1]
    verify = json.loads((out / "fit" / "verify.json").read_text())
    assert verify["runs"] == [held_out[0].name, held_out[1].name] and verify["seeds"] == [0, 1]
    assert verify["run"] == held_out[0].name and len(verify["neighbours"]) == 1
    assert verify["losses"] == [losses[held_out[0].name], losses[held_out[1].name]]
    assert verify["measured_loss"] == pytest.approx(np.mean(verify["losses"]), rel=1e-12)
    predicted = verify["predicted"]["loss"]
    assert verify["relative_errors"] == pytest.approx([loss / predicted - 1 for loss in verify["losses"]])
    assert verify["relative_error"] == pytest.approx(verify["measured_loss"] / predicted - 1)
    noise = verify["predicted"]["seed_noise"]  # the sweep's two seeds, 0.4% apart
    assert noise == pytest.approx(0.004 / 2 ** 0.5 / 1.002, rel=1e-9)
    assert verify["predicted"]["seed_noise_degrees"] == 12  # 3 budgets × 4 sizes, one pair each
    assert verify["predicted"] == predict(fitted, verify["N"], verify["D"], noise, runs=2, noise_degrees=12)
    assert verify["predicted"]["prediction_runs"] == 2
    low, high = verify["predicted"]["prediction_interval"]
    side, level = "inside" if verify["inside_prediction_interval"] else "outside", verify["predicted"]["level"]
    assert level == 0.95 and (f"{side} the 95% prediction interval for the mean of 2 runs [{low:.4f}, {high:.4f}] "
                              f"(seed noise {100 * noise:.2f}%, 12 degrees of freedom)") in result.stdout
    each = ", ".join(f"{error:+.2%}" for error in verify["relative_errors"])
    assert (f"held-out runs {held_out[0].name}, {held_out[1].name} (each {each}) (N = {verify['N']:,}, "
            f"D = {verify['D']:.3g}): mean loss {verify['measured_loss']:.4f} against") in result.stdout


def test_held_out_run_and_seed_repeats_after_the_fit(tmp_path):
    """``verify:`` trains the compute-optimal run the fitted law predicts at 2× the largest budget and compares
    its loss with the law's; ``isoflop.repeat`` adds a second seed at one budget and the fit reports the noise.

    The sweep's own runs are given final losses from a known law (so the fit and its N_opt are known); the
    held-out run is planned from that fit and trained for real.
    """
    from jaxformer.scaling.allocation import ParametricLaw

    truth = ParametricLaw(E=1.0, A=200.0, B=168.5, alpha=0.35, beta=0.35)  # N_opt 16K at 1e9 … 47K at 8e9
    spec = variant(tmp_path, "verified", isoflop={"budgets": [1e9, 2e9, 4e9], "params": [8e3, 16e3, 32e3, 64e3],
                                                  "flops": "6ND", "repeat": {"budget": 2e9, "seeds": [1]}},
                   fit={"approaches": [2, 3], "bootstrap": 20}, verify={"factor": 2, "sizes": [0.5, 1, 2]})
    runs = plan_runs(load_spec(spec))
    assert len(runs) == 16 and sorted(run.seed for run in runs if run.budget == 2e9) == [0] * 4 + [1] * 4
    out = tmp_path / "out"
    for k, run in enumerate(runs):  # "trained": final losses of the known law, 0.3% apart between seeds
        loss = float(truth.loss(run.N, run.D)) * (1 + 0.003 * run.seed * (-1) ** k)
        final = {"params": run.N, "params_non_embedding": run.N_non_embedding, "tokens": run.D,
                 "flops_exact": run.C_exact, "flops_6nd": run.C_6nd, "val_loss": loss}
        (out / "runs" / run.name).mkdir(parents=True)
        (out / "runs" / run.name / "final.json").write_text(json.dumps(final))
    result = jaxformer("sweep", spec, "--out", out, "--workers", 2)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 to train" in result.stdout and "seed noise: 4 shapes trained with several seeds" in result.stdout
    fit = json.loads((out / "fit" / "fit.json").read_text())
    law = ParametricLaw.from_dict(fit["approach3"]["params"])
    assert law.a == pytest.approx(truth.a, abs=0.02)
    assert [w for w in fit["warnings"] if not w.startswith("bootstrap:")] == []  # no minimum at an edge
    verify = json.loads((out / "fit" / "verify.json").read_text())
    assert verify["budget"] == 8e9 and verify["run"].startswith("verify-C8e09-N")
    assert abs(verify["N"] / float(law.n_opt(8e9)) - 1) <= 0.25  # the size rule's nearest shape
    assert verify["D"] * 6 * verify["N"] == pytest.approx(8e9, rel=0.03)  # whole steps of the budget's tokens
    assert verify["tokens_per_param"] == verify["D"] / verify["N"]
    assert verify["predicted"]["loss"] == pytest.approx(float(law.loss(verify["N"], verify["D"])), rel=1e-12)
    low, high = verify["predicted"]["interval"]
    assert low < verify["predicted"]["loss"] < high
    final = json.loads((out / "runs" / verify["run"] / "final.json").read_text())  # trained here, for real
    assert verify["measured_loss"] == final["val_loss"] and final["tokens"] == verify["D"]
    assert verify["tolerance"] == 0.01  # the "within 1%"
    assert verify["within_tolerance"] == (abs(final["val_loss"] / verify["predicted"]["loss"] - 1) <= 0.01)
    assert verify["inside_interval"] == (low <= final["val_loss"] <= high)
    repeats = {}  # the seed noise the sweep measured: two seeds of 4 shapes at 2e9, 0.3% apart
    for row in json.loads(jaxformer("results", out, "--format", "json").stdout):
        repeats.setdefault((row["N"], row["D"]), []).append(row["loss"])
    spreads = [np.std(v, ddof=1) / np.mean(v) for v in repeats.values() if len(v) > 1]
    noise = np.sqrt(np.mean(np.square(spreads)))  # pooled over the 4 pairs (one degree of freedom each)
    assert verify["predicted"]["seed_noise"] == pytest.approx(noise) and noise == pytest.approx(0.003 / 2 ** 0.5, rel=0.01)
    assert verify["predicted"]["seed_noise_degrees"] == 4
    one_low, one_high = verify["predicted"]["prediction_interval"]
    assert one_low < low and high < one_high  # one run's interval holds the law's and the seed's noise
    assert verify["inside_prediction_interval"] == (one_low <= final["val_loss"] <= one_high)
    assert "prediction interval for one run" in result.stdout
    where = "inside" if verify["inside_interval"] else "outside"
    assert f"{where} its 95% interval [{low:.4f}, {high:.4f}]" in result.stdout, result.stdout
    judged = "within" if verify["within_tolerance"] else "beyond"
    assert (f"held-out run {verify['run']} (N = {verify['N']:,}, D = {verify['D']:.3g}): loss "  # not "mean loss"
            f"{final['val_loss']:.4f} against {verify['predicted']['loss']:.4f} predicted by Approach 3, "
            f"{100 * verify['relative_error']:+.2f}% ({judged} 1%)") in result.stdout
    assert verify["run"] not in (out / "results.csv").read_text()  # held out: no table or fit of the sweep has it
    held_out = sorted([verify, *verify["neighbours"]], key=lambda c: c["N"])  # half and twice N_opt around it
    assert len(held_out) == 3 and held_out[1]["run"] == verify["run"]
    assert held_out[0]["N"] < verify["N"] < held_out[2]["N"]
    assert all(6 * c["N"] * c["D"] == pytest.approx(8e9, rel=0.03) for c in held_out)  # one budget
    u, losses = np.log([c["N"] for c in held_out]), [c["measured_loss"] for c in held_out]
    p2, p1, _ = np.polyfit(u, losses, 2)
    vertex = -p1 / (2 * p2)
    expected = float(np.exp(vertex)) if p2 > 0 and u[0] < vertex < u[2] else None
    assert verify["measured_n_opt"] == (None if expected is None else pytest.approx(expected))
    assert verify["predicted_n_opt"] == pytest.approx(float(law.n_opt(8e9)))
    from matplotlib.image import imread

    for name in ("isoflop", "n_opt", "contour", "residuals"):  # the fit's figures open, and are not blank
        assert imread(out / "fit" / f"{name}.png").std() > 0.05, name
    again = jaxformer("sweep", spec, "--out", out)
    assert again.returncode == 0 and "3 held-out runs at C = 8e+09" in again.stdout, again.stdout
    assert "0 to train" in again.stdout.split("verify:")[1]
    assert json.loads((out / "fit" / "verify.json").read_text()) == verify


def test_a_law_without_a_compute_optimal_size_trains_no_held_out_run(tmp_path):
    """Approach 3 fitted to losses rising with N (alpha < 0) has no N_opt (nan). The held-out run was planned
    all the same, at nan parameters, which the size rule turned into its smallest model (1 layer of 1 head), and
    judged 'within 1%' as if compute-optimal; now planning it is refused, and the launch says 'verify skipped'."""
    from jaxformer.scaling.report import fit_table
    from jaxformer.scaling.table import load_table
    from jaxformer.sweep.sizing import shape_for_params
    from jaxformer.sweep.verify import plan_verify
    from jaxformer.train.config import config_from_dict

    table = tmp_path / "rising.csv"
    table.write_text("N,D,loss\n" + "".join(f"1e{k},{1 + k % 2}e6,{2.0 + 0.1 * k:.1f}\n" for k in range(1, 8)))
    report = fit_table(load_table(table), "3", resamples=0)
    assert report.approach3.law.alpha < 0 and np.isnan(report.laws()["Approach 3"].n_opt(4e9))
    spec = load_spec(variant(tmp_path, "rising", fit={"approaches": [3]}, verify={"factor": 2}))
    with pytest.raises(ValueError, match=r"^the fitted Approach 3 gives no compute-optimal size at C = 4e\+09 "
                                         r"\(N_opt nan\), so there is no held-out run to train$"):
        plan_verify(spec, plan_runs(spec), report)
    base = plan_runs(spec)[0]
    with pytest.raises(ValueError, match="target params must be a positive number, got nan"):
        shape_for_params(float("nan"), config_from_dict(base.config).model, spec.shape)


@pytest.mark.parametrize("rule", ["exact", "6ND"])
def test_a_grids_held_out_budget_is_the_factor_times_its_largest_run_in_the_fits_flops_rule(tmp_path, rule):
    """A grid has no budgets: the held-out run's is ``verify.factor`` times the largest run's C, counted as the
    fit counts it (``fit.flops``; exact FLOPs are 1.12–1.18x 6ND at these sizes, so the two budgets differ)."""
    from jaxformer.scaling.report import fit_table
    from jaxformer.scaling.table import load_table
    from jaxformer.sweep.verify import plan_verify

    table = tmp_path / "falling.csv"  # a law with a compute-optimal size: loss falls with N and with D
    table.write_text("N,D,loss\n" + "".join(f"{n:g},{d:g},{2 + 300 / n ** 0.35 + 300 / d ** 0.35:.6f}\n"
                                            for n in (4e3, 8e3, 16e3, 32e3) for d in (1e5, 3e5, 1e6)))
    report = fit_table(load_table(table), "3", resamples=0)
    spec = load_spec(variant(tmp_path, "grid", isoflop=None, grid={"params": [8e3, 16e3], "tokens": [1e5, 2e5]},
                             fit={"approaches": [3], "flops": rule}, verify={"factor": 3}))
    runs = plan_runs(spec)
    largest = max(run.C_exact if rule == "exact" else run.C_6nd for run in runs)
    assert max(run.C_exact for run in runs) > 1.1 * max(run.C_6nd for run in runs)
    held_out = plan_verify(spec, runs, report)
    assert held_out[0].budget == pytest.approx(3 * largest, rel=1e-12)
    assert held_out[0].flops_rule == rule


def test_a_new_fit_removes_the_verify_json_that_judged_the_old_one(tmp_path):
    """fit/verify.json compares held-out runs with one fit's law. A relaunch that refitted and then did not verify
    (verify skipped: the new law has no N_opt; or verify: removed from the spec) left the old verify.json beside
    the new fit.json, still saying the held-out run met the law; the new fit now removes it."""
    from jaxformer.scaling.allocation import PRESETS
    from jaxformer.scaling.synthetic import isoflop_sweep
    from jaxformer.sweep.fit import fit_sweep
    from jaxformer.sweep.spec import FitSpec
    from jaxformer.sweep.table import write_sweep

    table = isoflop_sweep(PRESETS["chinchilla"], np.logspace(18, 20, 3), sizes=5)
    out = write_sweep(table, tmp_path / "sweep")
    rows = [{"status": "done", "flops_rule": "exact", "N": n, "D": d, "loss": loss}
            for n, d, loss in zip(table.N, table.D, table.loss)]  # the results rows the launch hands the fit
    (out / "fit").mkdir()
    (out / "fit" / "verify.json").write_text(json.dumps({"run": "verify-old", "within_tolerance": True}))
    text, report = fit_sweep(out, rows, FitSpec(approaches=[3], bootstrap=0))
    assert report is not None and "wrote" in text
    assert sorted(path.name for path in (out / "fit").glob("*.json")) == ["fit.json"]


def test_held_out_runs_that_fail_are_named_and_fail_the_launch(tmp_path, monkeypatch):
    """The sweep's runs are finished (losses from a known law, nothing trains); both held-out runs fail as they
    train (a stand-in for the worker's training that fails every run): the launch names them, counts them failed
    and writes no verify.json."""
    from jaxformer.scaling.allocation import ParametricLaw
    from jaxformer.sweep.launch import LaunchOptions, launch
    from jaxformer.train.attempt import Attempt
    from sweep_helpers import InProcessPool

    truth = ParametricLaw(E=1.0, A=200.0, B=168.5, alpha=0.35, beta=0.35)
    isoflop = {"budgets": [1e9, 2e9, 4e9], "params": [8e3, 16e3, 32e3, 64e3], "flops": "6ND"}
    spec = load_spec(variant(tmp_path, "failing", isoflop=isoflop,
                             fit={"approaches": [2, 3], "bootstrap": 20}, verify={"factor": 2, "sizes": [1, 2]}))
    runs, out = plan_runs(spec), tmp_path / "out"
    for run in runs:
        (out / "runs" / run.name).mkdir(parents=True)
        (out / "runs" / run.name / "final.json").write_text(json.dumps(
            {"params": run.N, "params_non_embedding": run.N_non_embedding, "tokens": run.D, "flops_exact": run.C_exact,
             "flops_6nd": run.C_6nd, "val_loss": float(truth.loss(run.N, run.D))}))

    def attempt_together(config_paths, overrides, run_dirs):
        return [Attempt("failed", error=FloatingPointError("loss is nan at step 3")) for _ in run_dirs]

    monkeypatch.setattr("jaxformer.train.attempt.attempt_together", attempt_together)
    lines = []
    result = launch(spec, runs, out, LaunchOptions(workers=1, threads=1), report=lines.append, pool=InProcessPool())
    held_out = sorted((path.stem for path in (out / "configs").glob("verify-*.yaml")),
                      key=lambda name: int(name.split("-N")[1].split("-")[0]))  # N_opt, then 2 N_opt
    assert len(held_out) == 2 and result.failed == held_out
    assert f"verify: 2 held-out runs at C = 8e+09 ({held_out[0]} the compute-optimal one), 2 to train" in lines
    reason = "FloatingPointError: loss is nan at step 3"
    assert [line for line in lines if line.startswith("[")][-2:] == [
        f"[queued 1 failed 1] {held_out[0]}: failed in 0m00s ({reason})",
        f"[failed 2] {held_out[1]}: failed in 0m00s ({reason})"]
    assert lines[-1] == f"verify: held-out runs did not finish: {', '.join(held_out)} (see {out / 'logs'})"
    assert not (out / "fit" / "verify.json").exists()
