"""Sweep formulas: the hyperparameter rules evaluate, and nothing else does (no code from a spec ever runs)."""

import json
import math
from pathlib import Path

import pytest
import yaml

from jaxformer.sweep.formula import FormulaError, check, evaluate
from jaxformer.sweep.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
VARIABLES = {"N": 3e4, "D": 1e6, "C": 1.8e11, "d_model": 32, "num_layers": 2, "seed": 1}


@pytest.mark.parametrize(("formula", "expected"), [
    ("min(1e-2, 3e-3 * (N / 3e4) ** -0.3)", 3e-3),
    ("0.99 if N < 1e5 else 0.95", 0.99),
    ("0.99 if N > 1e5 else 0.95", 0.95),
    ("C / (6 * N)", 1e6),
    ("sqrt(d_model) * 2 + num_layers // 2 - seed % 2", math.sqrt(32) * 2 + 1 - 1),
    ("max(log(N), log2(8), log10(100), exp(0))", math.log(3e4)),
    ("1 < N < 1e5 and D >= 1e6", True),
    ("N > 1e9 or 7", 7),
    ("int(round(N / 1000))", 30),
    ("-(2 ** 3) + abs(-1) + ceil(0.5) + floor(1.5)", -5),
    ("not N > 1", False),
    ("3e-3 * pi / pi", 3e-3),
    ("d_model ** 0.5", math.sqrt(32)),  # powers: an int only where both operands are and the exponent is not negative
    ("2 ** -1", 0.5),
    ("num_layers ** 10 + d_model ** 0", 1025),
])
def test_formulas_evaluate_like_python_arithmetic(formula, expected):
    value = evaluate(formula, VARIABLES)
    assert value == pytest.approx(expected) and type(value) is type(expected)


ESCAPES = [
    ("().__class__.__base__.__subclasses__()", "attribute access"),
    ("N.__class__", "attribute access"),
    ("__import__('os').system('touch /tmp/pwned')", "__import__"),
    ("[c for c in (1, 2)]", "comprehension"),
    ("(lambda: 1)()", "lambda"),
    ("N[0]", "subscript"),
    ("'abc'", "only numbers"),
    ("open('/etc/passwd')", "'open'"),
    ("__builtins__", "unknown name '__builtins__'"),
    ("globals()", "'globals'"),
    ("(x := 3)", "assignment expression"),
    ("max(*[1, 2])", "starred"),
    ("round(N, ndigits=2)", "keyword argument 'ndigits'"),
    ("min", "must be called"),
    ("1j", "only numbers"),
    ("import os", "not an expression"),
    ("N; 1", "not an expression"),
]


@pytest.mark.parametrize(("formula", "token"), ESCAPES)
def test_escape_attempts_are_refused_naming_the_token(formula, token, tmp_path):
    with pytest.raises(FormulaError) as error:
        check(formula)
    assert token in str(error.value)
    assert not Path("/tmp/pwned").exists()


def test_a_refused_token_is_quoted_up_to_40_characters_then_named_by_its_kind():
    for length, quoted in ((40, True), (41, False)):
        formula = "N." + "a" * (length - 2)
        with pytest.raises(FormulaError) as error:
            check(formula)
        token = f"{formula!r} (attribute access)" if quoted else "attribute access"
        assert str(error.value) == f"{token} is not allowed in a formula"


@pytest.mark.parametrize("formula", ["10**10**10", "N ** 1e6", "exp(1e6)", "1e400", "1 / (N - N)", "log(-1)", "max()",
                                     "round(N, -10**6)"])  # round(N, -10**9) would build 10**(10**9) first
def test_arithmetic_that_cannot_be_a_hyperparameter_is_one_error(formula):
    with pytest.raises(FormulaError):
        evaluate(formula, VARIABLES)


def test_the_limits_hold_exactly_where_they_say():
    """1000 characters, 100 levels of nesting (the expression node, 98 minus signs, the number), round's ±400 digits."""
    assert evaluate("N" + " " * 997 + "+1", VARIABLES) == 30001
    with pytest.raises(FormulaError, match="formula is longer than 1000 characters"):
        evaluate("N" + " " * 998 + "+1", VARIABLES)
    assert evaluate("-" * 98 + "1", VARIABLES) == 1
    with pytest.raises(FormulaError, match="formula nests deeper than 100 levels"):
        evaluate("-" * 99 + "1", VARIABLES)
    assert evaluate("round(N, 400) + round(N, -400)", VARIABLES) == 30000.0
    with pytest.raises(FormulaError, match=r"round's ndigits must be within -400..400"):
        evaluate("round(N, -401)", VARIABLES)


def test_an_integer_too_long_to_print_is_refused_with_its_size():
    formula = " * ".join(["int(1e308)"] * 15)  # 4621 digits: more than str() of an int may give
    with pytest.raises(FormulaError, match="evaluates to an integer of about 4621 digits, past any float"):
        evaluate(formula, VARIABLES)


def test_every_formula_in_the_committed_sweeps_is_accepted():
    formulas = 0
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        spec = load_spec(path)
        for key, formula in spec.hyperparameters.items():
            if isinstance(formula, str):
                value = evaluate(formula, VARIABLES)
                assert isinstance(value, (int, float)) and math.isfinite(value), (path.name, key)
                formulas += 1
    for path in sorted((ROOT / "experiments").glob("*/tune.json")):  # the rules tuning stages wrote
        value = evaluate(json.loads(path.read_text())["rule"]["formula"], VARIABLES)
        assert isinstance(value, (int, float)) and math.isfinite(value), path
        formulas += 1
    assert formulas >= 5


def test_a_hostile_spec_fails_at_load_naming_the_key(tmp_path):
    spec = yaml.safe_load((ROOT / "sweeps" / "tiny.yaml").read_text())
    spec["hyperparameters"]["optimizer.lr"] = "().__class__.__base__.__subclasses__()"
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match=r"hyperparameters\.optimizer\.lr: .*__subclasses__' \(attribute access\)"):
        load_spec(path)
