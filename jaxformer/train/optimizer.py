"""AdamW with global-norm clipping, on a learning-rate schedule whose length is the run's length.

The schedule is Optax's ``warmup_cosine_decay_schedule`` over exactly ``total_steps`` =
``ceil(D / (batch_size · seq_len))`` updates: linear warmup from 0 over
``round(warmup_fraction · total_steps)`` steps, then a cosine to ``final_lr_fraction · lr``.
Update ``k`` (0-based) uses the schedule's value at ``k + 1``, so the first update is not
wasted at lr = 0 and the last one (``k = total_steps - 1``, the one that completes D tokens)
is taken at exactly the final learning rate. A run that stops early therefore never reads a
schedule that "had not finished" — the flaw Hoffmann et al. (2022) found in the first
scaling-law fits, whose runs shared one schedule whatever their D.

The schedule is evaluated once on the host (`learning_rates`) and each step receives its
learning rate as an argument, multiplying the AdamW update computed at unit learning rate
(``-lr · (adam + wd · p)`` either way). The compiled train step then does not depend on D,
so JAX's persistent compilation cache serves every run of a sweep with the same shapes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxformer.configs import FRACTION, NON_NEGATIVE, POSITIVE, Range, Section, setting


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(Section):
    """AdamW with global-norm clipping; linear warmup then cosine decay ending at the run's last step.

    lr: peak learning rate. warmup_fraction: share of the run's steps spent warming up from 0.
    final_lr_fraction: the learning rate at the last step, as a fraction of ``lr``.
    grad_clip: maximum global gradient norm (0 turns clipping off). Weight decay skips vectors.
    """

    SECTION = "optimizer"

    lr: float = setting(3e-3, POSITIVE)
    warmup_fraction: float = setting(0.05, Range(0.0, 1.0, high_open=True))
    final_lr_fraction: float = setting(0.1, FRACTION)
    weight_decay: float = setting(0.1, NON_NEGATIVE)
    beta1: float = setting(0.9, Range(0.0, 1.0, high_open=True))
    beta2: float = setting(0.95, Range(0.0, 1.0, high_open=True))
    eps: float = setting(1e-8, POSITIVE)
    grad_clip: float = setting(1.0, NON_NEGATIVE)


def warmup_steps(config: OptimizerConfig, total_steps: int) -> int:
    return min(round(config.warmup_fraction * total_steps), total_steps - 1)


def learning_rate_schedule(config: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """``schedule(k)``: the learning rate of update ``k`` (0 ≤ k < total_steps); constant after."""
    if total_steps < 1:
        raise ValueError(f"a run needs at least one step, got total_steps={total_steps}")
    end_value = config.lr * config.final_lr_fraction
    base = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.lr,
        warmup_steps=warmup_steps(config, total_steps),
        decay_steps=total_steps,
        end_value=end_value,
    )

    def schedule(count):
        # Optax's cosine ends at peak · (end / peak), an ulp away from `end` for some values
        return jnp.where(count + 1 >= total_steps, end_value, base(count + 1))

    return schedule


def decay_mask(params):
    """Weight decay applies to matrices (embeddings included), not to norm scales or biases."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def learning_rates(config: OptimizerConfig, total_steps: int) -> np.ndarray:
    """``[total_steps]`` float32: the learning rate of every update; the last is ``final_lr_fraction · lr``."""
    return np.asarray(jax.vmap(learning_rate_schedule(config, total_steps))(jnp.arange(total_steps)), np.float32)


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """``clip_by_global_norm`` (if ``grad_clip`` > 0) then AdamW at unit learning rate (the step scales it)."""
    adamw = optax.adamw(
        learning_rate=1.0,
        b1=config.beta1,
        b2=config.beta2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        mask=decay_mask,
    )
    if config.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(config.grad_clip), adamw)
    return adamw
