"""Pure functions over JAX arrays: no state, no Flax. Per-head tensors are ``[batch, seq, heads, head_dim]``."""

from jaxformer.functional.attention import dot_product_attention
from jaxformer.functional.feedforward import feed_forward
from jaxformer.functional.masks import causal_mask, padding_mask, sliding_window_mask
from jaxformer.functional.norms import layer_norm, rms_norm
from jaxformer.functional.positions import alibi_bias, alibi_slopes, apply_rope, sinusoidal_positions
from jaxformer.functional.sampling import sample_logits, sampling_distribution

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "causal_mask",
    "dot_product_attention",
    "feed_forward",
    "layer_norm",
    "padding_mask",
    "rms_norm",
    "sample_logits",
    "sampling_distribution",
    "sinusoidal_positions",
    "sliding_window_mask",
]
