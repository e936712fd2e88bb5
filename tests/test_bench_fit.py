"""`jaxformer bench fit` end to end: on runs drawn exactly from a known law, the JAX fit and scipy's L-BFGS-B both
recover it, and each printed and recorded ratio is the quotient of the times recorded beside it."""

import json
import re

import numpy as np

from jaxformer.cli import main
from jaxformer.scaling.allocation import PRESETS
from jaxformer.train.peak import cpu_model

LAW = PRESETS["chinchilla"]  # Hoffmann et al.'s Approach-3 law


def test_bench_fit_recovers_a_known_law_with_both_solvers_and_reports_consistent_ratios(tmp_path, capsys):
    n, d = np.meshgrid(np.geomspace(1e7, 1e10, 6), np.geomspace(1e9, 1e12, 6))
    loss = LAW.loss(n, d)
    table = tmp_path / "runs.csv"
    rows = zip(n.ravel(), d.ravel(), loss.ravel())
    table.write_text("N,D,loss\n" + "".join(f"{a:.17g},{b:.17g},{c:.17g}\n" for a, b, c in rows))
    out = tmp_path / "fit.json"
    assert main(["bench", "fit", "--data", str(table), "--exclude-highest-loss", "0", "--scipy-stride", "150",
                 "--repeats", "1", "--bootstrap", "8", "--command-runs", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())

    assert (result["runs"], result["starts"], result["cpu_model"]) == (36, 4500, cpu_model())
    assert f"36 runs from {table}; 4500 starts; CPU: {cpu_model()}" in printed
    for solver in ("params_jax", "params_scipy"):
        for name, value in LAW.to_dict().items():
            assert abs(result[solver][name] / value - 1) < 1e-3, (solver, name, result[solver])
    assert result["objective_jax"] < 1e-9 and result["objective_scipy"] < 1e-9
    # 30 of the 4500 starts (every 150th), each counted 150 times
    assert result["scipy_stride"] == 150 and result["converged_scipy"] % 150 == 0
    assert 0 < result["converged_scipy"] <= 4500
    assert result["speedup_wall"] == result["scipy_s"] / result["jax_warm_s"]
    assert result["speedup_cpu"] == result["scipy_cpu_s"] / result["jax_warm_cpu_s"]
    assert result["speedup_first_call"] == result["scipy_s"] / result["jax_first_s"]
    command = result["command"]
    assert command["command"] == f"jaxformer fit {table} --approach 3 --bootstrap 0 --exclude-highest-loss 0"
    assert len(command["cold_runs_s"]) == len(command["warm_runs_s"]) == 1
    assert command["speedup_cold"] == result["scipy_s"] / command["cold_s"]
    assert command["speedup_warm"] == result["scipy_s"] / command["warm_s"]
    # one round: its scipy slice is all of scipy's (strided) starts, so paired and overall ratios are one number
    assert np.isclose(command["speedup_cold_paired"], command["speedup_cold"])
    assert result["bootstrap_resamples"] == 8 and set(result["bootstrap_se"]) == {"E", "alpha", "beta", "a"}
    printed_speedup = re.search(r"speedup ([\d.]+)x wall, ([\d.]+)x CPU", printed)
    assert printed_speedup.groups() == (f"{result['speedup_wall']:.1f}", f"{result['speedup_cpu']:.1f}")
