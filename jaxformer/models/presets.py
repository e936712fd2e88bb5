"""Named model configurations: published architectures and the textbook examples.

Published sizes (checked by the tests through the accounting): gpt2 124,439,808;
gpt2-medium 354,823,168; llama2-7b 6,738,415,616; llama3-8b 8,030,261,248;
mistral-7b 7,241,732,096; t5-small 60,506,624. ``bert-base`` and ``transformer-base``
follow their papers' shapes; ``bert-base`` leaves out BERT's token-type embeddings, embedding LayerNorm and pooler
(``num_token_types=2, embedding_norm=True, pooler=True`` add them; a BERT checkpoint imported with
`jaxformer.hf` has them).
"""

from __future__ import annotations

from jaxformer.architecture import DERIVED_FIELDS, ModelConfig, grouped_kv_heads

# GPT-2's MLP takes the tanh approximation of GELU (its `gelu_new`), as nanoGPT does
_GPT2 = dict(vocab_size=50257, max_seq_len=1024, activation="gelu_tanh", norm="layernorm", position="learned",
             use_bias=True, tie_embeddings=True)
_LLAMA = dict(activation="swiglu", norm="rmsnorm", norm_eps=1e-5, position="rope", use_bias=False,
              tie_embeddings=False, d_model=4096, num_layers=32, num_heads=32)

PRESETS: dict[str, ModelConfig] = {
    # byte-level sizes for this laptop; the defaults of `jaxformer train`
    "tiny": ModelConfig(vocab_size=256, d_model=64, num_layers=2, num_heads=4, max_seq_len=256,
                        activation="swiglu", norm="rmsnorm", position="rope", use_bias=False, tie_embeddings=True),
    "gpt2": ModelConfig(d_model=768, num_layers=12, num_heads=12, **_GPT2),
    "gpt2-medium": ModelConfig(d_model=1024, num_layers=24, num_heads=16, **_GPT2),
    "llama2-7b": ModelConfig(vocab_size=32000, d_ff=11008, max_seq_len=4096, **_LLAMA),
    "llama3-8b": ModelConfig(vocab_size=128256, num_kv_heads=8, d_ff=14336, max_seq_len=8192, rope_base=500000.0,
                             **_LLAMA),
    "mistral-7b": ModelConfig(vocab_size=32000, num_kv_heads=8, d_ff=14336, max_seq_len=32768, sliding_window=4096,
                              **_LLAMA),
    # the textbook's hypothetical mixture of experts: d = 4096, 32 layers, 8 experts, top-2
    "moe-8x-top2": ModelConfig(vocab_size=32000, d_model=4096, num_layers=32, num_heads=32, max_seq_len=4096,
                               activation="gelu", norm="rmsnorm", position="rope", use_bias=False,
                               tie_embeddings=False, num_experts=8, experts_per_token=2),
    "bert-base": ModelConfig(family="encoder", vocab_size=30522, d_model=768, num_layers=12, num_heads=12,
                             max_seq_len=512, activation="gelu", norm="layernorm", norm_position="post",
                             norm_eps=1e-12, position="learned", use_bias=True, tie_embeddings=True),
    # Vaswani et al. 2017, §3.4: the shared embedding's weights are multiplied by √d_model
    "transformer-base": ModelConfig(family="encoder_decoder", vocab_size=37000, d_model=512, num_layers=6,
                                    num_encoder_layers=6, num_heads=8, max_seq_len=1024, activation="relu",
                                    norm="layernorm", norm_position="post", position="sinusoidal",
                                    use_bias=True, tie_embeddings=True, scale_embeddings=True),
    # T5 (Raffel et al. 2020): relative position biases, unscaled attention, RMSNorm, no biases, tied and rescaled head
    "t5-small": ModelConfig(family="encoder_decoder", vocab_size=32128, d_model=512, num_layers=6,
                            num_encoder_layers=6, num_heads=8, head_dim=64, d_ff=2048, max_seq_len=512,
                            activation="relu", norm="rmsnorm", norm_eps=1e-6, norm_position="pre",
                            position="relative_bias", attention_scale=1.0, use_bias=False, tie_embeddings=True,
                            scale_head_inputs=True),
}


def get_preset(name: str) -> ModelConfig:
    """The preset ``name``; an unknown name raises ``ValueError`` listing the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[name]


def model_config_from_dict(data: dict) -> ModelConfig:
    """A `ModelConfig` from a mapping; ``preset: NAME`` starts from a preset and the other keys override it.

    Unknown keys and wrong types raise ``ValueError`` naming ``model.<key>``.
    """
    import dataclasses

    from jaxformer.configs import from_dict

    data = dict(data)
    preset = data.pop("preset", None)
    if preset is not None:
        base = dataclasses.asdict(get_preset(str(preset)))
        # sizes the preset derived from its width are re-derived when the width changes; its grouped-query
        # attention keeps its group size (query heads per K/V head), as MaxText keeps num_kv_heads when only the
        # width changes, and heads the group does not divide are refused (`grouped_kv_heads`)
        resized = bool({"d_model", "num_heads"} & data.keys())
        group = base["num_heads"] // base["num_kv_heads"]
        for derived in DERIVED_FIELDS:
            if derived not in data and resized:
                base[derived] = None
        heads = data.get("num_heads", base["num_heads"])
        if resized and "num_kv_heads" not in data and isinstance(heads, int) and heads > 0:
            base["num_kv_heads"] = grouped_kv_heads(heads, group)
            if base["num_kv_heads"] is None:
                raise ValueError(f"model.num_heads: {heads} is not a multiple of preset {preset}'s {group} query "
                                 f"heads per K/V head; give a multiple of {group}, or set model.num_kv_heads")
        data = {**base, **data}
    return from_dict(ModelConfig, data, prefix="model")


def resolve_model(config_path: str | None, preset: str | None) -> ModelConfig:
    """The model of exactly one of a YAML file (a ``model:`` section or a bare model mapping) or a preset name."""
    if (config_path is None) == (preset is None):
        raise ValueError("give exactly one of CONFIG.yaml or --preset NAME")
    if preset is not None:
        return get_preset(preset)
    from jaxformer.configs import load_yaml, shown

    data = load_yaml(config_path)
    if "model" in data and not isinstance(data["model"], dict):
        raise ValueError(f"{config_path}: model must be a mapping of model fields, got {shown(data['model'])}")
    return model_config_from_dict(data["model"] if "model" in data else data)
