"""Pure functions over JAX arrays: no state, no Flax. Per-head tensors are ``[batch, seq, heads, head_dim]``.

Shape letters. An array's name ends in one capital letter per axis (``q_BTHD`` is
``[batch, query, heads, head_dim]``), and bracketed shapes in docstrings use the same
letters. This is the one legend for the whole ``jaxformer`` package (every subpackage, its
commands and benchmarks, not ``functional`` and ``nn`` alone); a module's docstring may add notes
but never a second meaning, and a new letter is added here first. All 26 letters are taken: an
axis none of them names is written as a word in brackets (``[resamples]``, ``[budgets]``,
``[starts, Q]``) and its array's name carries no letter suffix.

- ``A`` stacked batches: gradient-accumulation micro-batches, validation batches
- ``B`` batch (sequences)
- ``C`` expert capacity: rows of the buffer each expert computes (MoE)
- ``D`` head dimension
- ``E`` model width (``d_model``)
- ``F`` FFN hidden width (``d_ff``; ``expert_d_ff`` inside experts)
- ``G`` query heads per key/value head, ``H // K``
- ``H`` query heads
- ``I``, ``O`` input and output features of :func:`dense` (its flattened contraction and result axes)
- ``J`` rotary frequencies, ``D // 2`` (one per coordinate pair)
- ``K`` key/value heads
- ``L`` keys per tile of blockwise attention (``block_size``)
- ``M`` key tiles of blockwise attention, ``ceil(S / L)``
- ``N`` flattened tokens: ``B·T`` (or all leading axes) merged into one axis
- ``P`` rows of a position table: positions (``max_seq_len``), or T5's relative-position buckets
- ``Q`` parameters of a fitted law (``jaxformer.scaling``: log A, log B, log E, alpha, beta)
- ``R`` routed experts per token, the router's top-``k`` (``experts_per_token``)
- ``S`` key/value length: keys attended to, the encoder's source or context length
- ``T`` query/sequence length: the tokens being processed (or generated)
- ``U`` independent jobs of the pooled fit solver (its starts)
- ``V`` vocabulary
- ``W`` training window length, ``T + 1`` (inputs plus the next-token targets)
- ``X`` experts: any stack of expert FFNs (routed or shared)
- ``Y`` runs: the data rows a law is fitted to, or runs trained together on a leading axis
  (``jaxformer.train.together``: ``windows_YABW``)
- ``Z`` slots of the pooled fit solver (jobs in flight)
- ``1`` an axis of size 1, kept for broadcasting (``mask_B1TS``)

A letter says what an axis indexes, not its size: ``prompt_BT`` and ``first_BT`` may
differ in ``T``. Lower-case letters in ``einsum`` strings follow the same legend. The
scaling-law notation of ``jaxformer.accounting`` and ``jaxformer.scaling`` (``N``
parameters, ``D`` training tokens, ``C`` compute, ``L`` loss) names scalars, not axes.
"""

from jaxformer.functional.cross_entropy import cross_entropy
from jaxformer.functional.dense import dense
from jaxformer.functional.dot_product import dot_product_attention
from jaxformer.functional.blockwise import blockwise_attention
from jaxformer.functional.dispatch import attention
from jaxformer.functional.feedforward import feed_forward
from jaxformer.kernel import KernelConfig
from jaxformer.functional.masks import attention_mask, causal_mask, padding_mask, sliding_window_mask
from jaxformer.functional.moe import load_balancing_loss, moe_feed_forward, route
from jaxformer.functional.norms import layer_norm, rms_norm
from jaxformer.functional.pooling import l2_normalize, mean_pool
from jaxformer.functional.positions import (alibi_bias, alibi_bias_from_slopes, alibi_slopes, apply_rope,
                                            relative_position_bias, relative_position_buckets, rope_frequencies,
                                            sinusoidal_positions)
from jaxformer.functional.sampling import sample_logits, sampling_distribution

__all__ = [
    "KernelConfig",
    "alibi_bias",
    "alibi_bias_from_slopes",
    "alibi_slopes",
    "apply_rope",
    "attention",
    "attention_mask",
    "blockwise_attention",
    "causal_mask",
    "cross_entropy",
    "dense",
    "dot_product_attention",
    "feed_forward",
    "l2_normalize",
    "layer_norm",
    "load_balancing_loss",
    "mean_pool",
    "moe_feed_forward",
    "padding_mask",
    "relative_position_bias",
    "relative_position_buckets",
    "rms_norm",
    "rope_frequencies",
    "route",
    "sample_logits",
    "sampling_distribution",
    "sinusoidal_positions",
    "sliding_window_mask",
]
