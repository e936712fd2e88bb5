"""Flax NNX modules that own parameters (with logical axis names) and call ``jaxformer.functional``."""

from jaxformer.nn.attention import Attention
from jaxformer.nn.block import Block, Stack
from jaxformer.nn.embeddings import Embedding, check_context
from jaxformer.nn.feedforward import FeedForward
from jaxformer.nn.moe import MoE
from jaxformer.nn.norms import Norm

__all__ = ["Attention", "Block", "Embedding", "FeedForward", "MoE", "Norm", "Stack", "check_context"]
