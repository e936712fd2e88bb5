"""`KernelConfig`: how attention and the projections are computed — never what they compute.

The implementation and its tiles change only the order of floating-point sums, never the
parameters or the function: so they are not part of `jaxformer.architecture.ModelConfig`
(parameter counts, presets and resume checks never see them), and a run may change them on
resume. A model is built with one (`jaxformer.models.build_model(cfg, kernel=…)`); a
training run reads it from its ``kernel`` section. It sits beside `jaxformer.architecture`, below
`jaxformer.functional`, so that a config is read and checked without importing JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from jaxformer.configs import SIZE, Section, setting

IMPLEMENTATIONS = ("naive", "blockwise", "xla", "fused")  # of attention (`jaxformer.functional.dispatch`)
MATMUL_IMPLS = ("xla", "onednn")  # of the projections (`jaxformer.functional.dense`)


@dataclasses.dataclass(frozen=True)
class KernelConfig(Section):
    """attention_impl: naive | blockwise | xla | fused (`jaxformer.functional.attention`), or ``auto``: a
    training run times the candidates on its machine and trains with the fastest
    (`jaxformer.train.kernel_choice`); a model built outside training needs one of the four.

    attention_block_size: the key tile of ``blockwise``. attention_query_block_size: causal
    self-attention over a whole sequence is computed in blocks of this many queries, skipping
    the fully masked score tiles (``None``: one block).

    matmul_impl: how the projections (`jaxformer.functional.dense`) multiply: ``xla``, or
    ``onednn``: bf16 and fp32 products through oneDNN's matmul (`jaxformer.functional.onednn_matmul`),
    which reaches the CPU's bf16 units and has its own fp32 kernels; machines without the kernel use XLA.
    ``auto``: a training run times both on its projection and keeps the faster
    (`jaxformer.train.matmul_choice`).

    Forward-mode derivatives (``jax.jvp``, ``jax.jacfwd``) of a model need attention_impl ``naive`` or ``xla``
    and matmul_impl ``xla``: ``blockwise``, ``fused`` and ``onednn`` define their gradients by ``jax.custom_vjp``,
    which JAX has no forward mode for. ``jax.vmap`` and reverse mode to any order work with every implementation.
    """

    SECTION = "kernel"

    attention_impl: Literal[(*IMPLEMENTATIONS, "auto")] = "naive"
    attention_block_size: int = setting(128, SIZE)
    attention_query_block_size: int | None = setting(64, SIZE)
    matmul_impl: Literal[(*MATMUL_IMPLS, "auto")] = "xla"

    def attention_options(self) -> dict:
        """The keyword arguments of `jaxformer.functional.attention` this config sets."""
        return {"impl": self.attention_impl, "block_size": self.attention_block_size,
                "query_block_size": self.attention_query_block_size}
