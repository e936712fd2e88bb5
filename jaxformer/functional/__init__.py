"""Pure functions over JAX arrays: no state, no Flax. Per-head tensors are ``[batch, seq, heads, head_dim]``."""

from jaxformer.functional.dense import dense
from jaxformer.functional.dot_product import dot_product_attention
from jaxformer.functional.blockwise import blockwise_attention
from jaxformer.functional.dispatch import attention
from jaxformer.functional.feedforward import feed_forward
from jaxformer.functional.kernel import KernelConfig
from jaxformer.functional.masks import attention_mask, causal_mask, padding_mask, sliding_window_mask
from jaxformer.functional.moe import load_balancing_loss, moe_feed_forward, route
from jaxformer.functional.norms import layer_norm, rms_norm
from jaxformer.functional.positions import alibi_bias, alibi_bias_from_slopes, alibi_slopes, apply_rope, sinusoidal_positions
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
    "dense",
    "dot_product_attention",
    "feed_forward",
    "layer_norm",
    "load_balancing_loss",
    "moe_feed_forward",
    "padding_mask",
    "rms_norm",
    "route",
    "sample_logits",
    "sampling_distribution",
    "sinusoidal_positions",
    "sliding_window_mask",
]
