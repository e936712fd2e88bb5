"""Learning-rate schedules: WSD (linear and 1-sqrt cooldowns) and constant equal their formulas at every update."""

import math

import numpy as np
import pytest

from jaxformer.train.config import load_config
from jaxformer.train.optimizer import learning_rates
from jaxformer.train.optimizer_config import OptimizerConfig, cooldown_steps, warmup_steps


def wsd_formula(k: int, total: int, warmup: int, cooldown: int, lr: float, end: float, shape: str) -> float:
    """The learning rate of update k (0-based), which reads the schedule at k + 1 (see optimizer.py)."""
    t = k + 1
    if t >= total:
        return end
    if t < warmup:
        return lr * t / warmup
    start = total - cooldown
    if t < start:
        return lr
    x = (t - start) / cooldown
    return end + (lr - end) * (1 - (x if shape == "linear" else math.sqrt(x)))


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
@pytest.mark.parametrize("total", [7, 100, 1001, 9000])  # 9000: three of the blocks it is evaluated in
def test_wsd_learning_rate_is_the_formula_at_every_update(shape, total):
    config = OptimizerConfig(lr=2e-3, schedule="wsd", warmup_fraction=0.05, final_lr_fraction=0.1,
                             cooldown_fraction=0.2, cooldown_shape=shape)
    warmup, cooldown = warmup_steps(config, total), cooldown_steps(config, total)
    # 5% and 20% of the run in whole steps, the cooldown at least one: the formula's phases, not the code's alone
    assert (warmup, cooldown) == {7: (0, 1), 100: (5, 20), 1001: (50, 200), 9000: (450, 1800)}[total]
    expected = [wsd_formula(k, total, warmup, cooldown, 2e-3, 2e-4, shape) for k in range(total)]
    # atol: Optax's warmup is peak − peak·(1 − t/warmup) in float32, whose first rates are an ulp or two of the
    # peak off (1.3e-5 relative at t = 1 of a 450-step warmup)
    np.testing.assert_allclose(learning_rates(config, total), expected, rtol=2e-6, atol=5e-10)
    assert learning_rates(config, total)[-1] == np.float32(2e-4)


def test_the_stable_phase_does_not_depend_on_the_run_length_when_warmup_is_in_tokens():
    config = OptimizerConfig(lr=1e-2, schedule="wsd", warmup_tokens=4096, cooldown_fraction=0.1)
    short, long = learning_rates(config, 200, tokens_per_step=512), learning_rates(config, 2000, tokens_per_step=512)
    assert warmup_steps(config, 200, 512) == 8
    np.testing.assert_array_equal(short[:200 - cooldown_steps(config, 200)], long[:200 - cooldown_steps(config, 200)])
    assert short[7] == np.float32(1e-2) and short[6] == pytest.approx(1e-2 * 7 / 8)


def test_constant_keeps_the_peak_after_warmup():
    lrs = learning_rates(OptimizerConfig(lr=3e-3, schedule="constant", warmup_fraction=0.1), 50)
    assert lrs[0] == pytest.approx(3e-3 / 5) and np.all(lrs[4:] == np.float32(3e-3))


def test_schedule_keys_are_checked_and_warmup_tokens_need_the_step_size():
    with pytest.raises(ValueError, match="optimizer.schedule must be one of 'cosine', 'wsd', 'constant', got 'step'"):
        load_config(None, ["optimizer.schedule=step"])
    with pytest.raises(ValueError, match=r"optimizer.cooldown_fraction must be in \(0.0, 1.0\], got 0.0"):
        load_config(None, ["optimizer.cooldown_fraction=0"])
    with pytest.raises(ValueError, match="warmup_tokens needs the run's tokens per step"):
        learning_rates(OptimizerConfig(warmup_tokens=100), 10)
    assert load_config(None, ["optimizer.schedule=wsd", "optimizer.cooldown_shape=1-sqrt"]).optimizer.schedule == "wsd"
