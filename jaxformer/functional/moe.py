"""Mixture of experts as pure functions: routing, capacity-based dispatch, combine, balancing loss.

A token is routed to its ``k`` most probable experts; for ``k > 1`` their gates are renormalised
to sum to one over the chosen ``k`` (Mixtral, GShard), and with one expert the gate is its router
probability itself (Switch Transformer: renormalised, it would be 1 whatever the router said, and the
router would learn from the balancing loss alone). Dispatch is capacity-based
(GShard/Switch): each expert processes at most ``C = min(N, ceil(capacity_factor·N·k/X))``
rows, so the experts compute ``X·C`` rows in all — about ``capacity_factor·N·k``, not
``N·X``. Assignments are served in priority order — every token's first choice before
any second choice, earlier tokens first — and an assignment finding its expert full is
*dropped*: it contributes zero, and the residual connection carries the token on.

Dropping is a training device, and it makes a token's output depend on which other
tokens share the batch: a full forward over a sequence may drop an assignment that a
one-token decode step (where every expert has room) serves. So drops happen only when
asked for: ``capacity_factor=None`` (the default) gives ``C = N`` — every assignment
served, through the same dispatch, on ``X·N`` buffer rows — and that is what inference
uses (``model(tokens)``, ``model.extend``, generation, the validation pass); only the
training objective passes ``model.capacity_factor`` (``model(tokens, drop_tokens=True)``).
A ``capacity_factor >= X/k`` also gives ``C = N``, so training with it never drops either.

Shape letters as in the legend of :mod:`jaxformer.functional`; here ``N`` is the tokens
(batch and sequence flattened), ``R = k`` the experts chosen per token, ``X`` the experts,
``C`` the capacity per expert, ``F`` the expert hidden width.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.checks import require_positive
from jaxformer.functional.feedforward import feed_forward


class Routing(NamedTuple):
    """``probs [N, X]`` router softmax; ``experts [N, R]`` chosen ids (best first); ``gates [N, R]`` their weights
    (summing to 1 when ``R > 1``; the router probability when ``R = 1``)."""

    probs: jax.Array
    experts: jax.Array
    gates: jax.Array


def route(x_NE: jax.Array, w_router_EX: jax.Array, k: int) -> Routing:
    """Softmax router, top-``k`` experts per token, gates renormalised over the chosen ``k`` when ``k > 1`` (the
    module docstring says why not for one).

    ``x_NE [N, E]`` tokens, ``w_router_EX [E, X]``; returns `Routing` with float32 ``probs [N, X]`` and
    ``gates [N, R]``, int32 ``experts [N, R]`` (``R = k``).
    """
    num_experts = w_router_EX.shape[-1]
    if not 1 <= k <= num_experts:
        raise ValueError(f"experts per token must be in [1, {num_experts}], got {k}")
    logits_NX = jnp.einsum("ne,ex->nx", x_NE, w_router_EX, preferred_element_type=jnp.float32)
    probs_NX = jax.nn.softmax(logits_NX, axis=-1)
    top_probs_NR, experts_NR = jax.lax.top_k(probs_NX, k)
    gates_NR = top_probs_NR if k == 1 else top_probs_NR / jnp.sum(top_probs_NR, axis=-1, keepdims=True)
    return Routing(probs_NX, experts_NR, gates_NR)


def load_balancing_loss(routing: Routing) -> jax.Array:
    """Switch Transformer's auxiliary loss ``X · Σ_x f_x · P_x`` (Fedus et al. 2021), unweighted.

    ``f_x``: fraction of the ``N·R`` assignments sent to expert ``x`` (before capacity
    drops; not differentiable); ``P_x``: mean router probability of ``x``. Equals 1 for
    perfectly uniform routing and grows as the router concentrates. A float32 scalar, from
    ``routing.probs [N, X]`` and ``routing.experts [N, R]``.
    """
    num_experts = routing.probs.shape[-1]
    counts_X = jnp.sum(jax.nn.one_hot(routing.experts, num_experts, dtype=jnp.float32), axis=(0, 1))
    fraction_X = counts_X / routing.experts.size
    return num_experts * jnp.sum(fraction_X * jnp.mean(routing.probs, axis=0))


def expert_capacity(num_tokens: int, num_experts: int, k: int, capacity_factor: float | None) -> int:
    """Rows per expert: ``min(N, ceil(capacity_factor · N · k / X))`` (at least 1); ``N`` for None (no drops)."""
    if capacity_factor is None:
        return num_tokens
    require_positive("capacity_factor", capacity_factor)
    return max(1, min(num_tokens, math.ceil(capacity_factor * num_tokens * k / num_experts)))


def dispatch_slots(experts_NR: jax.Array, num_experts: int, capacity: int) -> jax.Array:
    """``[N, R]`` row of each assignment in the flattened ``[X·C]`` expert buffer; ``X·C`` marks a drop.

    Priority: first choices of all tokens, then second choices, …; within a choice,
    earlier tokens first. An assignment's row is ``expert·C + (its rank at that expert)``.
    """
    N, R = experts_NR.shape
    one_hot_RNX = jax.nn.one_hot(experts_NR.T, num_experts, dtype=jnp.int32)
    rank_RNX = jnp.cumsum(one_hot_RNX.reshape(R * N, num_experts), axis=0).reshape(R, N, num_experts) - 1
    rank_NR = jnp.sum(rank_RNX * one_hot_RNX, axis=-1).T
    return jnp.where(rank_NR < capacity, experts_NR * capacity + rank_NR, num_experts * capacity)


def dispatch(x_NE: jax.Array, slots_NR: jax.Array, num_experts: int, capacity: int) -> jax.Array:
    """Gathers routed tokens into the expert buffer ``[X, C, E]`` (unused rows are zero)."""
    R = slots_NR.shape[1]
    rows = jnp.zeros((num_experts * capacity + 1, x_NE.shape[-1]), x_NE.dtype)  # last row: the drop bin
    rows = rows.at[slots_NR.reshape(-1)].set(jnp.repeat(x_NE, R, axis=0))
    return rows[:-1].reshape(num_experts, capacity, x_NE.shape[-1])


def combine(y_XCE: jax.Array, slots_NR: jax.Array, gates_NR: jax.Array) -> jax.Array:
    """``[N, E]``: each token's gate-weighted sum of its experts' outputs (dropped ones give 0)."""
    rows = y_XCE.reshape(-1, y_XCE.shape[-1])
    rows = jnp.concatenate([rows, jnp.zeros((1, rows.shape[-1]), rows.dtype)])
    return jnp.einsum("nr,nre->ne", gates_NR.astype(rows.dtype), rows[slots_NR])


def experts_feed_forward(x_XCE: jax.Array, experts: dict[str, jax.Array | None], activation: str, *,
                         matmul_impl: str = "xla") -> jax.Array:
    """Each expert's FFN on its own rows: :func:`feed_forward` mapped over the leading expert axis.

    ``experts`` holds ``w_in_XEF``, ``w_out_XFE`` and optionally ``w_gate_XEF``,
    ``b_in_XF``, ``b_gate_XF``, ``b_out_XE`` (None when absent). ``matmul_impl``: the projections' `dense` impl.
    """
    names = ("w_in_XEF", "w_out_XFE", "w_gate_XEF", "b_in_XF", "b_gate_XF", "b_out_XE")
    present = {name: experts.get(name) for name in names if experts.get(name) is not None}

    def one_expert(x_CE, weights):
        get = weights.get
        return feed_forward(x_CE, get("w_in_XEF"), get("w_out_XFE"), activation=activation,
                            w_gate_EF=get("w_gate_XEF"), b_in_F=get("b_in_XF"), b_gate_F=get("b_gate_XF"),
                            b_out_E=get("b_out_XE"), matmul_impl=matmul_impl)

    return jax.vmap(one_expert)(x_XCE, present)


def moe_feed_forward(
    x_NE: jax.Array,
    w_router_EX: jax.Array,
    experts: dict[str, jax.Array | None],
    *,
    k: int,
    activation: str,
    capacity_factor: float | None = None,
    matmul_impl: str = "xla",
) -> tuple[jax.Array, jax.Array]:
    """Routed experts on ``[N, E]`` tokens: returns ``(y [N, E], load-balancing loss)``.

    The experts run on the ``[X, C, E]`` buffer only, ``C`` from :func:`expert_capacity`:
    ``capacity_factor=None`` (inference) serves every assignment, a number (training)
    drops those past capacity (see the module docstring). ``matmul_impl``: the experts' `dense` impl (the
    router's logits stay an fp32 einsum).
    """
    N = x_NE.shape[0]
    num_experts = w_router_EX.shape[-1]
    routing = route(x_NE, w_router_EX, k)
    capacity = expert_capacity(N, num_experts, k, capacity_factor)
    slots_NR = dispatch_slots(routing.experts, num_experts, capacity)
    y_XCE = experts_feed_forward(dispatch(x_NE, slots_NR, num_experts, capacity), experts, activation,
                                 matmul_impl=matmul_impl)
    return combine(y_XCE, slots_NR, routing.gates), load_balancing_loss(routing)
