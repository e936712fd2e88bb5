"""Closed-form compute-optimal allocation against direct minimisation along iso-FLOP lines."""

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from jaxformer.accounting import count_params, training_flops_per_token
from jaxformer.models import get_preset
from jaxformer.scaling.allocation import PRESETS, SIX_ND, FlopsPerToken, ParametricLaw, PowerLawAllocation, allocate
from jaxformer.scaling.powerlaw import allocation_from_optima

REFERENCES = Path(__file__).resolve().parents[2] / "shared" / "data" / "README.md"  # the published fits


def test_published_chinchilla_law_closed_form():
    law = PRESETS["chinchilla"]
    assert (law.E, law.A, law.B, law.alpha, law.beta) == (1.69, 406.4, 410.7, 0.34, 0.28)
    assert law.a == pytest.approx(0.28 / 0.62)
    G = (0.34 * 406.4 / (0.28 * 410.7)) ** (1 / 0.62)
    assert law.G == pytest.approx(G)
    out = allocate(law, [1e21, 5.76e23])
    np.testing.assert_allclose(out.N, G * (np.array([1e21, 5.76e23]) / 6) ** law.a)
    np.testing.assert_allclose(out.N * out.D * 6, out.C)
    np.testing.assert_allclose(out.loss, law.loss(out.N, out.D))


@pytest.mark.parametrize("name", ["chinchilla", "epoch"])
@pytest.mark.parametrize("C", [1e19, 5.76e23, 1e26])
def test_closed_form_is_the_minimum_along_the_iso_flop_line(name, C):
    law = PRESETS[name]
    res = minimize_scalar(lambda x: law.loss(np.exp(x), C / (6 * np.exp(x))), bounds=(5, 40), method="bounded",
                          options={"xatol": 1e-10})
    assert float(law.n_opt(C)) == pytest.approx(np.exp(res.x), rel=1e-4)


@pytest.mark.parametrize(("name", "paper"), [("chinchilla", "Hoffmann et al. Approach 3"),
                                           ("epoch", "Besiroglu et al.")])
def test_the_presets_are_the_published_fits(name, paper):
    """Each preset's five numbers as the paper prints them (../shared/data/README.md)."""
    entry = REFERENCES.read_text().split(f"- {paper}")[1].split("\n- ")[0]
    published = {key: float(re.search(rf"{symbol} = ([0-9.]+)", entry)[1])
                 for key, symbol in (("E", "E"), ("A", "A"), ("B", "B"), ("alpha", "α"), ("beta", "β"))}
    assert {key: getattr(PRESETS[name], key) for key in published} == published and PRESETS[name].flops == SIX_ND


def test_epoch_refit_gives_about_20_tokens_per_parameter():
    # Besiroglu et al.: the refit implies ~20 tokens/parameter, consistent with Chinchilla's training
    assert allocate(PRESETS["epoch"], 5.76e23).tokens_per_param[0] == pytest.approx(18.4, abs=0.5)


def test_power_law_allocation():
    law = PowerLawAllocation(k_N=0.1, a=0.5, k_D=1 / 0.6, b=0.5, k_L=30.0, gamma=-0.05)
    out = allocate(law, 1e20)
    assert out.N[0] == pytest.approx(1e9) and out.D[0] == pytest.approx(1e20 / 6e9)
    assert out.loss[0] == pytest.approx(30.0 * 1e20 ** -0.05)


def test_bad_budget_and_law():
    with pytest.raises(ValueError, match="flops must be positive and finite, got -1.0"):
        allocate(PRESETS["chinchilla"], [1e20, -1.0])
    with pytest.raises(ValueError, match="missing B, beta"):
        ParametricLaw.from_dict({"E": 1, "A": 2, "alpha": 0.3})
    with pytest.raises(ValueError, match="alpha must be positive and finite, got -0.3"):
        ParametricLaw.from_dict({"E": 1, "A": 2, "B": 3, "alpha": -0.3, "beta": 0.3})
    with pytest.raises(ValueError, match="beta must be positive and finite, got 0.0"):  # no optimum without it
        ParametricLaw.from_dict({"E": 1, "A": 2, "B": 3, "alpha": 0.3, "beta": 0.0})
    with pytest.raises(ValueError, match="E must be positive and finite, got -0.1"):
        ParametricLaw.from_dict({"E": -0.1, "A": 2, "B": 3, "alpha": 0.3, "beta": 0.3})
    assert ParametricLaw.from_dict({"E": 0, "A": 2, "B": 3, "alpha": 0.3, "beta": 0.3}).E == 0  # E may be 0


def test_flops_per_token_is_fitted_from_the_runs_and_is_6n_for_6nd_tables():
    N = np.geomspace(8e3, 3e5, 9)
    D = np.geomspace(1e6, 4e7, 9)[::-1]
    fitted = FlopsPerToken.fit(N, D, 9.7 * N**0.96 * D)
    assert (fitted.k, fitted.p) == (pytest.approx(9.7, rel=1e-9), pytest.approx(0.96, rel=1e-12))
    assert FlopsPerToken.fit(N, D, 6 * N * D) is SIX_ND and SIX_ND.describe() == "C = 6ND"
    one_size = FlopsPerToken.fit(np.full(3, 1e6), D[:3], 7e6 * D[:3])  # no slope to fit: its own cost per token
    assert (one_size.k, one_size.p) == (pytest.approx(7.0, rel=1e-12), 1.0)
    # jaxformer's own accounting: small models cost more than 6N per token, and less so as N grows
    models = [dataclasses.replace(get_preset("tiny"), d_model=d, num_heads=d // 16, num_kv_heads=d // 16,
                                  num_layers=layers)
              for d, layers in ((16, 1), (32, 2), (64, 3), (128, 4))]
    n = np.array([count_params(m).total for m in models], np.float64)
    exact = FlopsPerToken.fit(n, np.ones(4), [training_flops_per_token(m, 64, "exact") for m in models])
    assert exact.k > 6 and 0.8 < exact.p < 1


@pytest.mark.parametrize("k, p", [(6.0, 1.0), (9.7, 0.96), (14.0, 0.9)])
@pytest.mark.parametrize("C", [1e12, 1e19, 5.76e23])
def test_closed_form_with_a_flops_model_is_the_minimum_along_its_iso_flop_line(k, p, C):
    """N_opt minimises L(N, C / (k·N^p)); D_opt spends exactly C; a = β/(α+pβ), b = 1 − p·a."""
    law = dataclasses.replace(PRESETS["chinchilla"], flops=FlopsPerToken(k, p))
    res = minimize_scalar(lambda x: law.loss(np.exp(x), C / (k * np.exp(x) ** p)), bounds=(2, 40), method="bounded",
                          options={"xatol": 1e-10})
    assert float(law.n_opt(C)) == pytest.approx(np.exp(res.x), rel=1e-4)
    assert float(law.d_opt(C) * k * law.n_opt(C) ** p) == pytest.approx(C, rel=1e-12)
    assert law.a == pytest.approx(0.28 / (0.34 + p * 0.28)) and law.b == pytest.approx(1 - p * law.a)
    assert np.log(law.n_opt(10 * C) / law.n_opt(C)) / np.log(10) == pytest.approx(law.a, rel=1e-9)
    assert np.log(law.d_opt(10 * C) / law.d_opt(C)) / np.log(10) == pytest.approx(law.b, rel=1e-9)


def test_power_laws_through_optima_spend_the_budget_with_the_flops_model():
    C = np.array([1e11, 1e12, 1e13])
    n_opt = 2.5e4 * (C / 1e12) ** 0.6
    flops = FlopsPerToken(9.7, 0.96)
    allocation = allocation_from_optima(C, n_opt, np.array([2.0, 1.8, 1.6]), flops)
    np.testing.assert_allclose(allocation.d_opt(C) * flops(allocation.n_opt(C)), C, rtol=1e-9)
    assert allocation.a == pytest.approx(0.6) and allocation.b == pytest.approx(1 - 0.96 * 0.6)


def test_fit_records_the_tables_flops_per_token_and_load_law_reads_it_back(tmp_path):
    import json

    from jaxformer.scaling.allocation import load_law
    from jaxformer.scaling.report import fit_table, jsonable
    from jaxformer.scaling.table import RunTable

    law = PRESETS["chinchilla"]
    N = np.repeat(np.geomspace(1e7, 1e9, 6), 3)
    D = np.tile(np.geomspace(1e9, 1e11, 3), 6)
    table = RunTable.from_arrays(N, law.loss(N, D), D=D, C=9.7 * N**0.96 * D)
    report = fit_table(table, "3", resamples=0)
    assert fit_table(table, 3, resamples=0).approach3.law == report.approach3.law  # a notebook's number
    for wrong in (4, True, "3,2"):
        with pytest.raises(ValueError, match=f"approach must be one of 1, 2, 3 or 'all', got {wrong!r}"):
            fit_table(table, wrong, resamples=0)
    assert report.approach3.law.flops == FlopsPerToken(pytest.approx(9.7), pytest.approx(0.96))
    fitted = report.approach3.law
    assert fitted.a == pytest.approx(fitted.beta / (fitted.alpha + 0.96 * fitted.beta), rel=1e-9)
    assert "C = 9.7·N^0.9600·D" in report.text()
    (tmp_path / "fit.json").write_text(json.dumps(jsonable(report.to_dict())))
    _, loaded = load_law(tmp_path / "fit.json")
    assert loaded == report.approach3.law and float(loaded.n_opt(1e21)) == float(report.approach3.law.n_opt(1e21))


def test_a_law_whose_exponents_sum_to_zero_has_nan_exponents_not_a_division_error():
    """All-equal losses fit alpha = beta = 0: a, b, G and the allocation are nan (a used to raise ZeroDivisionError)."""
    flat = ParametricLaw(E=3.0, A=1.0, B=1.0, alpha=0.0, beta=0.0)
    assert np.isnan([flat.a, flat.b, flat.G]).all()
    assert np.isnan(allocate(flat, 1e20).N).all()
    resampled = ParametricLaw(E=np.array([3.0, 3.0]), A=np.ones(2), B=np.ones(2), alpha=np.array([0.0, 0.3]),
                              beta=np.array([0.0, 0.3]))
    np.testing.assert_array_equal(resampled.a, [np.nan, 0.5])
    np.testing.assert_array_equal(resampled.b, [np.nan, 0.5])


@pytest.mark.parametrize(
    "fit, message",
    [
        ({"flops_per_token": {"k": "6", "p": 1}}, "flops_per_token.k must be a number, got '6'"),
        ({"flops_per_token": {"k": 0, "p": 1}}, "flops_per_token.k must be positive and finite, got 0.0"),
        ({"flops_per_token": {"k": 6, "p": -1}}, "flops_per_token.p must be positive and finite, got -1.0"),
        ({"flops_per_token": None}, "flops_per_token must be an object with k and p, got None"),
        ({"approach2": {"power_laws": {"k_N": -1, "a": 0.5, "k_D": 0.1, "b": 0.5}}},
         "approach2.power_laws.k_N must be positive and finite, got -1.0"),
        ({"approach1": {"power_laws": {"k_N": 1, "a": 0.5, "k_D": float("inf"), "b": 0.5}}},
         "approach1.power_laws.k_D must be positive and finite, got inf"),
        ({"approach2": {"power_laws": {"k_N": 1, "a": float("nan"), "k_D": 0.1, "b": 0.5}}},
         "approach2.power_laws.a must be finite, got nan"),
    ],
)
def test_load_law_refuses_a_bad_flop_count_or_power_law_in_one_line(tmp_path, fit, message):
    import json

    from jaxformer.scaling.allocation import load_law

    if "approach1" not in fit and "approach2" not in fit:
        fit = {"approach3": {"params": PRESETS["epoch"].to_dict()}, **fit}
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fit))
    with pytest.raises(ValueError, match=f"fit.json: {re.escape(message)}$"):
        load_law(path)


def test_budgets_are_labelled_apart_however_close():
    """Per-budget keys (tokens_per_param@C, N_opt@C): three significant figures unless two budgets would collide
    (1e21 and 1.004e21 were both "1e+21", the second's interval overwriting the first's)."""
    from jaxformer.scaling.allocation import budget_labels
    from jaxformer.scaling.bootstrap import law_quantities

    assert budget_labels([5.76e23, 1e21]) == ["5.76e+23", "1e+21"]
    assert budget_labels([1.2345e21, 3e21]) == ["1.23e+21", "3e+21"]  # three figures, not four
    assert budget_labels([1e21, 1.004e21]) == ["1e+21", "1.004e+21"]
    assert budget_labels([1e21, np.nextafter(1e21, 2e21)]) == ["1e+21", "1.0000000000000001e+21"]
    law = PRESETS["epoch"]
    got = law_quantities(law, [1e21, 1.004e21])
    for C, key in ((1e21, "tokens_per_param@1e+21"), (1.004e21, "tokens_per_param@1.004e+21")):
        assert got[key] == pytest.approx(float(law.d_opt(C) / law.n_opt(C)), rel=1e-12)


def test_an_approach_2_fit_file_loads_with_its_loss_law_and_without_one(tmp_path):
    """A fit's power laws (`jaxformer fit --json`) load as written: L_opt = k_L C^γ when it has one, none when its
    k_L and γ are null (a fit whose loss law could not be fitted)."""
    from jaxformer.scaling.allocation import load_law

    law = PowerLawAllocation(k_N=0.1, a=0.5, k_D=1 / 0.6, b=0.5, k_L=30.0, gamma=-0.05)
    for written in (law, dataclasses.replace(law, k_L=None, gamma=None)):
        path = tmp_path / "fit.json"
        path.write_text(json.dumps({"approach2": {"power_laws": written.to_dict()}}))
        assert load_law(path) == ("approach 2", written)
    assert np.isnan(load_law(path)[1].loss_opt(1e20)) and law.loss_opt(1e20) == pytest.approx(30 * 1e20 ** -0.05)
