"""The jitted pieces of training: the train step (with gradient accumulation) and the validation pass.

The train state is one pytree, donated to each step so parameters and optimizer state are
updated in place::

    {"params": nnx.State,             # fp32 master weights
     "opt_state": optax state,
     "step": int32,                   # updates taken
     "sums": {"loss", "grad_norm": f32, "count": int32},   # since the last log row
     "first_nonfinite": int32}        # the first step with a non-finite loss, gradient or parameter norm, else -1

The running sums live on the device and in the checkpoint, so logging needs no per-step
host synchronisation and a resumed run logs the same means as an uninterrupted one.
Losses are next-token cross-entropy in nats/token (the MoE auxiliary loss is added to the
objective, not to the reported loss).
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxformer.accounting import count_params
from jaxformer.architecture import ModelConfig
from jaxformer.functional.cross_entropy import cross_entropy
from jaxformer.kernel import KernelConfig
from jaxformer.models.pure import init_params

State = dict[str, Any]
Stacked = Literal["vmap", "map"] | None  # how a program steps Y runs on a leading axis (`over_runs`)


def over_runs(fn: Callable, how: Stacked, in_axes: tuple = (0, 0, 0)) -> Callable:
    """``fn`` applied to Y runs stacked on a leading axis of the arguments ``in_axes`` marks (None: shared).

    ``vmap``: batched into one computation; ``map``: ``jax.lax.map``, the runs one after another inside
    one program (plain matmuls, one dispatch for all; `jaxformer bench together` times both). Either way
    no value crosses runs.
    """
    if how == "vmap":
        return jax.vmap(fn, in_axes=in_axes)
    stacked = [i for i, axis in enumerate(in_axes) if axis is not None]

    def mapped(*args):
        def one(slices):
            whole = list(args)
            for i, value in zip(stacked, slices):
                whole[i] = value
            return fn(*whole)

        return jax.lax.map(one, tuple(args[i] for i in stacked))

    return mapped


def empty_sums() -> dict[str, jax.Array]:
    return {"loss": jnp.zeros((), jnp.float32), "grad_norm": jnp.zeros((), jnp.float32),
            "count": jnp.zeros((), jnp.int32)}


def init_state(params: nnx.State, optimizer: optax.GradientTransformation) -> State:
    return {"params": params, "opt_state": optimizer.init(params), "step": jnp.zeros((), jnp.int32),
            "sums": empty_sums(), "first_nonfinite": jnp.full((), -1, jnp.int32)}


def build_state(model: ModelConfig, seed: int, optimizer: optax.GradientTransformation,
                kernel: KernelConfig = KernelConfig()) -> tuple[nnx.GraphDef, State]:
    """``(graphdef, state)`` of a fresh model computing with ``kernel``; its parameter count must equal the
    accounting's."""
    graphdef, params = init_params(model, seed, kernel)
    held = sum(leaf.size for leaf in jax.tree.leaves(params))
    counted = count_params(model).total
    if held != counted:
        raise RuntimeError(f"the model holds {held:,} parameters but the accounting counts {counted:,}")
    return graphdef, init_state(params, optimizer)


def next_token_loss(graphdef: nnx.GraphDef, params: nnx.State, window_BW: jax.Array,
                    compute_dtype: jnp.dtype, *, drop_tokens: bool = True) -> tuple[jax.Array, jax.Array]:
    """``(objective, cross_entropy)`` on windows ``[B, T+1]``: predict ``w[:, 1:]`` from ``w[:, :-1]``.

    ``objective = cross_entropy + model.router_aux_loss_weight × aux_loss``, the model's
    unweighted MoE load-balancing loss (0 for a dense model): the one place the weight is applied.
    Parameters are cast to ``compute_dtype`` (bf16 compute from fp32 masters); logits are float32.
    ``drop_tokens``: MoE layers drop assignments past ``model.capacity_factor`` — the training
    objective does; the validation pass passes False and measures the model as inference runs it.
    """
    inputs_BT, targets_BT = window_BW[:, :-1], window_BW[:, 1:]
    compute_params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
    model = nnx.merge(graphdef, compute_params)  # `apply`, keeping the model for its config
    logits_BTV, aux_loss = model(inputs_BT, drop_tokens=drop_tokens)
    loss = cross_entropy(logits_BTV.astype(jnp.float32), targets_BT).mean()  # optax's, bit for bit
    return loss + model.cfg.router_aux_loss_weight * aux_loss, loss


def make_train_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, compute_dtype: str, *,
                    state_sharding: Any = None, batch_sharding: NamedSharding | None = None, stacked: Stacked = None):
    """``train_step(state, windows_ABW, lr) -> state``: one update from ``A`` accumulated micro-batches.

    ``optimizer`` works at unit learning rate (`jaxformer.train.optimizer`); ``lr`` (a float32
    scalar) scales its update, so the compiled step is independent of the schedule.
    With ``state_sharding`` (a tree of ``NamedSharding``, `jaxformer.parallel.Layout.shardings`)
    and ``batch_sharding`` the step is compiled for that layout (pjit semantics): the state
    keeps its sharding from step to step, ``lr`` is replicated, and GSPMD adds the collectives.

    ``stacked``: Y runs at once (`jaxformer.train.together`), ``train_step(state_Y, windows_YABW, lr_Y)``:
    every state leaf, the windows and the learning rate carry a leading run axis, and the same
    step is applied over it (`over_runs`: ``vmap`` or ``map``).
    """
    dtype = jnp.dtype(compute_dtype)
    grad_fn = jax.value_and_grad(lambda p, w: next_token_loss(graphdef, p, w, dtype), has_aux=True)

    def train_step(state: State, windows_ABW: jax.Array, lr: jax.Array) -> State:
        params = state["params"]

        def micro_step(carry, window_BW):
            grads_sum, loss_sum = carry
            (_, loss), grads = grad_fn(params, window_BW)
            return (jax.tree.map(jnp.add, grads_sum, grads), loss_sum + loss), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        (grads, loss), _ = jax.lax.scan(micro_step, (zeros, jnp.zeros((), jnp.float32)), windows_ABW)
        micro_batches = windows_ABW.shape[0]
        grads = jax.tree.map(lambda g: g / micro_batches, grads)
        loss = loss / micro_batches
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = optimizer.update(grads, state["opt_state"], params)
        updates = jax.tree.map(lambda u: lr * u, updates)
        new_params = optax.apply_updates(params, updates)
        step = state["step"] + 1
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.tree.norm(new_params))
        first_nonfinite = jnp.where((state["first_nonfinite"] < 0) & ~finite, step, state["first_nonfinite"])
        sums = state["sums"]
        return {
            "params": new_params,
            "opt_state": opt_state,
            "step": step,
            "sums": {"loss": sums["loss"] + loss, "grad_norm": sums["grad_norm"] + grad_norm,
                     "count": sums["count"] + 1},
            "first_nonfinite": first_nonfinite,
        }

    if stacked:
        train_step = over_runs(train_step, stacked)
    if state_sharding is None:
        return jax.jit(train_step, donate_argnums=0)
    replicated = NamedSharding(batch_sharding.mesh, PartitionSpec())
    return jax.jit(train_step, donate_argnums=0, in_shardings=(state_sharding, batch_sharding, replicated),
                   out_shardings=state_sharding)


def make_eval_pass(graphdef: nnx.GraphDef, compute_dtype: str, *, params_sharding: Any = None,
                   batch_sharding: NamedSharding | None = None, stacked: Stacked = None):
    """``eval_pass(params, batches_ABW) -> mean cross-entropy`` (nats/token) over all A batches.

    MoE layers drop no token (as at inference), so with ``capacity_factor < X/R`` this can
    differ from the training loss on the same windows.

    Shardings as for `make_train_step`; the loss comes back replicated. ``stacked``: the parameters of
    Y runs with a leading run axis, one set of batches for all, ``[Y]`` losses (`over_runs` of the same pass).
    """
    dtype = jnp.dtype(compute_dtype)

    def eval_pass(params: nnx.State, batches_ABW: jax.Array) -> jax.Array:
        losses = jax.lax.map(lambda window: next_token_loss(graphdef, params, window, dtype, drop_tokens=False)[1],
                             batches_ABW)
        return losses.mean()  # equal-sized batches: the mean of means is the mean over tokens

    if stacked:
        eval_pass = over_runs(eval_pass, stacked, in_axes=(0, None))
    if params_sharding is None:
        return jax.jit(eval_pass)
    replicated = NamedSharding(batch_sharding.mesh, PartitionSpec())
    return jax.jit(eval_pass, in_shardings=(params_sharding, batch_sharding), out_shardings=replicated)
