"""Closed-form compute-optimal allocation against direct minimisation along iso-FLOP lines."""

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from jaxformer.scaling.allocation import PRESETS, ParametricLaw, PowerLawAllocation, allocate


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
