"""`ModelConfig`: the one description of a model, read by the modules and by the accounting.

Everything a parameter count, a FLOP count or a module constructor needs is here, so
the count of a config and the parameters of the model built from it cannot drift.
Unset (``None``) sizes are resolved on construction: ``num_kv_heads = num_heads``,
``head_dim = d_model / num_heads``, ``d_ff = 4·d_model`` (GELU/ReLU) or ``8/3·d_model``
rounded up to a multiple of 32 (gated: SwiGLU/GEGLU, Llama's rule that keeps the FFN near 8d²).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from jaxformer.configs import NON_NEGATIVE, POSITIVE, SIZE, Section, setting

Family = Literal["decoder", "encoder", "encoder_decoder"]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh"]
Norm = Literal["layernorm", "rmsnorm"]
NormPosition = Literal["pre", "post", "sandwich"]
Position = Literal["learned", "sinusoidal", "rope", "alibi", "relative_bias", "none"]
RopeScaling = Literal["none", "llama3"]
SinusoidalLayout = Literal["interleaved", "split"]

# sizes resolved from others when unset (``__post_init__``)
DERIVED_FIELDS = ("num_kv_heads", "head_dim", "d_ff", "expert_d_ff")


def grouped_kv_heads(num_heads: int, group: int) -> int | None:
    """The K/V heads of a resized model: ``num_heads`` query heads in groups of ``group`` (the query heads per K/V
    head of the model it was resized from; 1: multi-head attention), or None where ``group`` does not divide them.

    The one rule of a preset given new heads (`jaxformer.models.presets`) and of the sweep's size rule
    (`jaxformer.sweep.sizing`): the group is kept exactly, never shrunk to fit — a smaller group, multi-head at
    worst, changes the parameter count and the K/V cache of every layer — so heads it does not divide are refused
    by the one and never chosen by the other (MaxText and Levanter likewise refuse heads ``num_kv_heads`` does not
    divide).
    """
    return num_heads // group if num_heads % group == 0 else None


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """Architecture of a transformer. Sizes are counts (not bytes); lengths are tokens.

    family: ``decoder`` (GPT/Llama: causal LM), ``encoder`` (BERT: bidirectional +
      masked-LM head), ``encoder_decoder`` (original transformer/T5: cross-attention).
    num_layers: decoder layers, or encoder layers for ``encoder``.
    num_encoder_layers: encoder layers of an ``encoder_decoder`` (else 0).
    num_experts: 0 for a dense FFN; otherwise every layer's FFN is a mixture of
      ``num_experts`` experts of width ``expert_d_ff`` (default ``d_ff``), each token
      routed to ``experts_per_token``, plus ``num_shared_experts`` that see every token.
    router_aux_loss_weight: weight of the MoE load-balancing loss in the training objective
      (`jaxformer.train.step.next_token_loss`); the models return that loss unweighted.
    sliding_window: if set, causal self-attention sees only the last ``sliding_window`` tokens (an encoder's
      layers see the whole sequence).
    activation: ``gelu`` is the exact (erf) GELU, ``gelu_tanh`` its tanh approximation
      (GPT-2's ``gelu_new``), ``silu`` the ungated SiLU (Marian's ``swish``); gated: ``swiglu`` (a SiLU
      gate), ``geglu`` (an exact-GELU gate), ``geglu_tanh`` (a tanh-GELU gate: T5 v1.1's ``gated-gelu``).
    position: ``relative_bias`` is T5's: no position signal in the embedding; every self-attention
      adds a learned ``[relative_attention_num_buckets, num_heads]`` bias of the bucketed query–key
      distance (bidirectional buckets in an encoder, causal ones in a decoder; none in
      cross-attention), one table per stack shared by its layers
      (`jaxformer.functional.relative_position_bias`), with distances from
      ``relative_attention_max_distance`` on sharing the last bucket.
    attention_scale: multiplies the query–key scores; ``None`` is ``1/√head_dim`` (T5: 1.0, unscaled).
    qkv_bias: biases on the query/key/value projections; ``None`` follows ``use_bias``
      (Qwen2: ``use_bias=False, qkv_bias=True``, so no output-projection or FFN biases).
    rope_scaling: ``llama3`` rescales RoPE's frequencies as Llama 3.1 does (``rope_scaling_factor``,
      ``rope_low_freq_factor``, ``rope_high_freq_factor``, ``rope_original_max_seq_len``);
      ``rope_scale`` is the separate linear position interpolation.
    sinusoidal_layout: ``interleaved`` (sin, cos pairs; Vaswani et al.) or ``split`` (all sines,
      then all cosines; Marian/fairseq).
    embedding_norm: a norm (``norm``) over the summed embeddings (BERT's embedding LayerNorm).
    num_token_types: rows of a token-type (segment) embedding table added to the embeddings (BERT: 2).
    scale_embeddings: token embeddings are multiplied by √d_model before positions are added (Marian).
    logit_bias: a ``[V]`` bias on the output logits (decoder, encoder–decoder; Marian's
      ``final_logits_bias``); the masked-LM head has its own with ``use_bias``.
    scale_head_inputs: decoder, encoder–decoder: the final hidden states are multiplied by
      ``d_model**-0.5`` before the output head (T5's ``scale_decoder_outputs``, set when its head is tied).
    mlm_head: ``encoder`` only: the masked-LM head; without it the model's output is the
      encoder's final hidden states (a bare BERT, a sentence encoder).
    pooler: ``encoder`` only: BERT's pooler, a dense ``[E, E]`` layer with tanh on the first
      token's hidden state (`jaxformer.models.embed` with ``pooling="pooler"``).
    init_from: not architecture: a checkpoint (a Hugging Face directory, a ``.gguf`` file or an
      ``import-hf`` directory, read by `jaxformer.hf`) whose parameters a training run starts
      from; its architecture fills the other model fields (`jaxformer.train.config`).

    How attention is computed (its implementation and tiles) is not architecture: it is the
    `jaxformer.kernel.KernelConfig` a model is built with.
    """

    SECTION = "model"

    family: Family = "decoder"
    vocab_size: int = setting(256, SIZE)
    d_model: int = setting(64, SIZE)
    num_layers: int = setting(2, SIZE)
    num_heads: int = setting(4, SIZE)
    num_kv_heads: int | None = setting(None, SIZE)
    head_dim: int | None = setting(None, SIZE)
    d_ff: int | None = setting(None, SIZE)
    max_seq_len: int = setting(256, SIZE)
    num_encoder_layers: int = setting(0, NON_NEGATIVE)
    activation: Activation = "gelu"
    norm: Norm = "layernorm"
    norm_position: NormPosition = "pre"
    norm_eps: float = setting(1e-5, POSITIVE)
    position: Position = "learned"
    rope_base: float = 10000.0
    rope_scale: float = 1.0
    use_bias: bool = True
    tie_embeddings: bool = True
    num_experts: int = setting(0, NON_NEGATIVE)
    experts_per_token: int = 2
    num_shared_experts: int = setting(0, NON_NEGATIVE)
    expert_d_ff: int | None = setting(None, SIZE)
    capacity_factor: float = setting(1.25, POSITIVE)
    router_aux_loss_weight: float = 0.01
    sliding_window: int | None = setting(None, SIZE)
    qkv_bias: bool | None = None
    rope_scaling: RopeScaling = "none"
    rope_scaling_factor: float = setting(8.0, POSITIVE)
    rope_low_freq_factor: float = setting(1.0, POSITIVE)
    rope_high_freq_factor: float = setting(4.0, POSITIVE)
    rope_original_max_seq_len: int = setting(8192, SIZE)
    sinusoidal_layout: SinusoidalLayout = "interleaved"
    embedding_norm: bool = False
    num_token_types: int = setting(0, NON_NEGATIVE)
    scale_embeddings: bool = False
    logit_bias: bool = False
    mlm_head: bool = True
    pooler: bool = False
    relative_attention_num_buckets: int = setting(32, SIZE)
    relative_attention_max_distance: int = setting(128, SIZE)
    attention_scale: float | None = setting(None, POSITIVE)
    scale_head_inputs: bool = False
    init_from: str | None = None

    def check(self) -> None:
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by model.num_heads ({self.num_heads}) "
                "unless model.head_dim is set"
            )
        self._resolve("num_kv_heads", self.num_heads)
        head_dim_from = "" if self.head_dim is not None else f" (model.d_model {self.d_model} / num_heads {self.num_heads})"
        self._resolve("head_dim", self.d_model // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_heads ({self.num_heads}) must be a multiple of model.num_kv_heads ({self.num_kv_heads})"
            )
        default_d_ff = -(-8 * self.d_model // 3 // 32) * 32 if self.is_gated else 4 * self.d_model
        self._resolve("d_ff", default_d_ff)
        self._resolve("expert_d_ff", self.d_ff)
        if self.position == "rope" and self.head_dim % 2:
            raise ValueError(f"model.head_dim must be even for rope, got {self.head_dim}{head_dim_from}")
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"model.d_model must be even for sinusoidal positions, got {self.d_model}")
        if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(
                f"model.experts_per_token must be in [1, num_experts={self.num_experts}], got {self.experts_per_token}"
            )
        if self.rope_scaling == "llama3" and self.rope_high_freq_factor <= self.rope_low_freq_factor:
            raise ValueError(
                f"model.rope_high_freq_factor ({self.rope_high_freq_factor}) must be above "
                f"model.rope_low_freq_factor ({self.rope_low_freq_factor})"
            )
        if self.family == "encoder" and self.logit_bias:
            raise ValueError("model.logit_bias is for decoder and encoder_decoder heads; an encoder's masked-LM "
                             "head has its bias with model.use_bias")
        if self.family == "encoder" and self.scale_head_inputs:
            raise ValueError("model.scale_head_inputs is for decoder and encoder_decoder heads")
        if self.position == "relative_bias" and (self.relative_attention_num_buckets < 4 or
                                                 self.relative_attention_max_distance <=
                                                 self.relative_attention_num_buckets // 2):
            raise ValueError(
                f"model.relative_attention_max_distance ({self.relative_attention_max_distance}) must be above "
                f"half of model.relative_attention_num_buckets ({self.relative_attention_num_buckets}, at least 4)"
            )
        if self.pooler and self.family != "encoder":
            raise ValueError(f"model.pooler needs family encoder, got family={self.family!r}")
        if not self.mlm_head and self.family != "encoder":
            raise ValueError(f"model.mlm_head=false needs family encoder, got family={self.family!r}")
        if (self.family == "encoder_decoder") != (self.num_encoder_layers > 0):
            raise ValueError(
                f"model.num_encoder_layers must be > 0 exactly when family is encoder_decoder "
                f"(family={self.family!r}, num_encoder_layers={self.num_encoder_layers})"
            )

    def _resolve(self, name: str, default: int) -> None:
        if getattr(self, name) is None:
            object.__setattr__(self, name, default)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_gated(self) -> bool:
        return self.activation in ("swiglu", "geglu", "geglu_tanh")

    @property
    def has_qkv_bias(self) -> bool:
        return self.use_bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_final_norm(self) -> bool:
        """Pre-norm and sandwich stacks end with a norm; post-norm stacks already did."""
        return self.norm_position != "post"


def check_context(cfg: ModelConfig, length: int, *, what: str = "sequence length") -> None:
    """Raises ``ValueError`` naming ``what`` when ``length`` positions do not fit the model's context.

    Every model is limited to ``cfg.max_seq_len`` positions (a learned table has no rows
    beyond it; the other schemes were never trained there). The one check of that limit:
    the embedding's forward pass, KV caches, generation and the training config call it.
    """
    if length > cfg.max_seq_len:
        table = "the learned position table" if cfg.position == "learned" else "the context"
        raise ValueError(f"{what} {length} is past {table} (model.max_seq_len={cfg.max_seq_len})")
