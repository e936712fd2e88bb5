"""AdamW with global-norm clipping, on a learning-rate schedule whose length is the run's length.

Schedules (``optimizer.schedule``), all Optax schedules over exactly ``total_steps`` =
``ceil(D / (batch_size · seq_len))`` updates, all starting with a linear warmup from 0:

- ``cosine`` (the default): a cosine from the peak ``lr`` to ``final_lr_fraction · lr`` at the
  last update (Hoffmann et al. 2022: a cosine matched to each run's length);
- ``wsd`` (warmup–stable–decay): the peak until the last ``cooldown_fraction`` of the run, then a
  cooldown to ``final_lr_fraction · lr``, ``linear`` or ``1-sqrt`` (Hägele et al. 2024). Its
  stable phase does not depend on the run's length when the warmup is given in tokens, so one
  long run at the peak can be continued into a cooldown at any length;
- ``constant``: the peak after warmup, to the end.

Warmup: ``warmup_tokens`` (when set) or ``warmup_fraction`` of the run's steps. Update ``k``
(0-based) uses the schedule's value at ``k + 1``, so the first update is not wasted at lr = 0
and the last one (the one that completes D tokens) is taken at exactly the final learning
rate. A run that stops early therefore never reads a schedule that "had not finished" — the
flaw Hoffmann et al. (2022) found in the first scaling-law fits, whose runs shared one
schedule whatever their D. (So ``final_lr_fraction: 0`` makes the last update a no-op; the
default 0.1 is Hoffmann et al.'s.)

The schedule is evaluated once on the host (`learning_rates`) and each step receives its
learning rate as an argument, multiplying the AdamW update computed at unit learning rate
(``-lr · (adam + wd · p)`` either way). The compiled train step then does not depend on D,
so one compiled program serves every run of a sweep with the same shapes.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxformer.train.optimizer_config import OptimizerConfig, cooldown_steps, transformation_settings, warmup_steps


def learning_rate_schedule(config: OptimizerConfig, total_steps: int,
                           tokens_per_step: int | None = None) -> optax.Schedule:
    """``schedule(k)``: the learning rate of update ``k`` (0 ≤ k < total_steps); constant after."""
    if total_steps < 1:
        raise ValueError(f"a run needs at least one step, got total_steps={total_steps}")
    peak = config.lr
    end_value = peak if config.schedule == "constant" else peak * config.final_lr_fraction
    warmup = warmup_steps(config, total_steps, tokens_per_step)
    if config.schedule == "cosine":
        base = optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=peak, warmup_steps=warmup,
                                                  decay_steps=total_steps, end_value=end_value)
    else:
        stable_end = total_steps if config.schedule == "constant" else total_steps - cooldown_steps(config, total_steps)
        stable_end = max(stable_end, warmup)
        pieces = [optax.linear_schedule(0.0, peak, max(warmup, 1)), optax.constant_schedule(peak),
                  _cooldown(peak, end_value, total_steps - stable_end, config.cooldown_shape)]
        base = optax.join_schedules(pieces, boundaries=[warmup, stable_end])

    def schedule(count):
        # the last update is at exactly the final value (Optax's cosine ends an ulp away for some values)
        return jnp.where(count + 1 >= total_steps, end_value, base(count + 1))

    return schedule


def _cooldown(peak: float, end: float, steps: int, shape: str) -> optax.Schedule:
    """From ``peak`` (count 0) to ``end`` (count ``steps``): ``end + (peak - end) · (1 - f(x))``, x = count / steps,
    f(x) = x (``linear``) or √x (``1-sqrt``)."""

    def cooldown(count):
        x = jnp.clip(count / max(steps, 1), 0.0, 1.0)
        return end + (peak - end) * (1.0 - (x if shape == "linear" else jnp.sqrt(x)))

    return cooldown


# the names `jaxformer.nn` gives biases: b, bias, bq/bk/bv/bo, b_in…, …_bias (T5's relative-position table too,
# as transformers' Trainer leaves every "bias" undecayed); attention and MoE biases are 2-D ([H, D], [X, F])
_BIAS = re.compile(r"b|bias|b[qkvo]|b_.*|.*_bias")


def decay_mask(params):
    """Weight decay applies to matrices (embeddings included), not to norm scales (1-D) or biases (any rank)."""
    def decayed(path, leaf) -> bool:
        names = [str(getattr(key, "key", getattr(key, "name", key))) for key in path]
        name = names[-2] if names[-1] == "value" and len(names) > 1 else names[-1]
        return leaf.ndim >= 2 and not _BIAS.fullmatch(name)

    return jax.tree_util.tree_map_with_path(decayed, params)


def learning_rates(config: OptimizerConfig, total_steps: int, tokens_per_step: int | None = None) -> np.ndarray:
    """``[total_steps]`` float32: the learning rate of every update; the last is the schedule's final value."""
    schedule = learning_rate_schedule(config, total_steps, tokens_per_step)
    # elementwise, in blocks of one shape: the ops compile once per process, not once per run length
    counts = np.arange(-(-total_steps // _BLOCK) * _BLOCK, dtype=np.int32).reshape(-1, _BLOCK)
    return np.concatenate([np.asarray(schedule(block), np.float32) for block in counts])[:total_steps]


_BLOCK = 4096


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """``clip_by_global_norm`` (if ``grad_clip`` > 0) then AdamW at unit learning rate (the step scales it)."""
    beta1, beta2, eps, weight_decay, grad_clip = transformation_settings(config)
    adamw = optax.adamw(learning_rate=1.0, b1=beta1, b2=beta2, eps=eps, weight_decay=weight_decay, mask=decay_mask)
    if grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(grad_clip), adamw)
    return adamw
