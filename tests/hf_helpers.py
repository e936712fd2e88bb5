"""Small random-weight ``transformers`` models of every family jaxformer converts (the peers of tests/test_hf*.py)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: every model here is built from a config

import numpy as np
import pytest
import torch
import transformers

VOCAB = 96

CONFIGS = {
    # GPT-2 as published: tanh GELU (gelu_new); a second with the exact GELU
    "gpt2": (transformers.GPT2LMHeadModel, dict(model_type="gpt2", n_embd=32, n_layer=2, n_head=4, n_positions=40,
                                                vocab_size=VOCAB, activation_function="gelu_new")),
    "gpt2-exact-gelu": (transformers.GPT2LMHeadModel, dict(model_type="gpt2", n_embd=32, n_layer=1, n_head=2,
                                                           n_positions=40, vocab_size=VOCAB, n_inner=48,
                                                           activation_function="gelu")),
    # GPT-2 with a head of its own (transformers reads lm_head.weight when tie_word_embeddings is false)
    "gpt2-untied": (transformers.GPT2LMHeadModel, dict(model_type="gpt2", n_embd=32, n_layer=1, n_head=4,
                                                       n_positions=40, vocab_size=VOCAB, tie_word_embeddings=False)),
    # Llama 3.1: GQA, RoPE (rotate-half) with llama3 rope_scaling, SwiGLU, RMSNorm, untied head
    "llama": (transformers.LlamaForCausalLM, dict(
        model_type="llama", hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=40, rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 32})),
    # a tied Llama with every bias (attention_bias = mlp_bias) and linear RoPE scaling
    "llama-bias-tied": (transformers.LlamaForCausalLM, dict(
        model_type="llama", hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
        vocab_size=VOCAB, max_position_embeddings=40, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "mistral": (transformers.MistralForCausalLM, dict(
        model_type="mistral", hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, vocab_size=VOCAB, max_position_embeddings=40, sliding_window=5)),
    "qwen2": (transformers.Qwen2ForCausalLM, dict(
        model_type="qwen2", hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=40, tie_word_embeddings=True,
        rope_theta=1e5)),
    "bert": (transformers.BertForMaskedLM, dict(
        model_type="bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        vocab_size=VOCAB, max_position_embeddings=40, type_vocab_size=2)),
    "bert-base-model": (transformers.BertModel, dict(
        model_type="bert", hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48,
        vocab_size=VOCAB, max_position_embeddings=40, type_vocab_size=3, hidden_act="gelu_new")),
    # untied heads: transformers 5 then ties nothing, so the MLM head adds cls.predictions.decoder.bias (not
    # cls.predictions.bias), and each of Marian's stacks embeds with its own embed_tokens (not model.shared)
    "bert-untied": (transformers.BertForMaskedLM, dict(
        model_type="bert", hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
        vocab_size=VOCAB, max_position_embeddings=40, type_vocab_size=2, tie_word_embeddings=False)),
    "marian-untied": (transformers.MarianMTModel, dict(
        model_type="marian", d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, vocab_size=VOCAB,
        max_position_embeddings=40, activation_function="swish", pad_token_id=VOCAB - 1,
        decoder_start_token_id=VOCAB - 1, eos_token_id=0, forced_eos_token_id=None, tie_word_embeddings=False)),
    # OPUS-MT's layout: √d embedding scale, swish, split sinusoids, final_logits_bias, post-LayerNorm
    "marian": (transformers.MarianMTModel, dict(
        model_type="marian", d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, vocab_size=VOCAB,
        max_position_embeddings=40, activation_function="swish", scale_embedding=True, pad_token_id=VOCAB - 1,
        decoder_start_token_id=VOCAB - 1, eos_token_id=0, forced_eos_token_id=None)),
    # T5 v1.0: relative position buckets (8, up to distance 6: the padded batches reach the log buckets),
    # unscaled attention, RMSNorm, ReLU, no biases, the tied head's input scaled by d_model**-0.5
    "t5": (transformers.T5ForConditionalGeneration, dict(
        model_type="t5", d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
        vocab_size=VOCAB, relative_attention_num_buckets=8, relative_attention_max_distance=6,
        decoder_start_token_id=0)),
    # T5 v1.1 / Flan-T5: gated-gelu, an untied head without the rescale, more decoder than encoder layers
    "t5-v1_1": (transformers.T5ForConditionalGeneration, dict(
        model_type="t5", d_model=32, d_kv=16, d_ff=40, num_layers=1, num_decoder_layers=2, num_heads=4,
        vocab_size=VOCAB, feed_forward_proj="gated-gelu", tie_word_embeddings=False, layer_norm_epsilon=1e-5,
        decoder_start_token_id=0, untie_head=True)),
}


def hf_model(name: str, seed: int = 0) -> torch.nn.Module:
    """The family ``name`` with random weights large enough that every parameter moves the logits.

    Weights ~ N(0, 0.2²) (T5's shared embedding N(0, 1)); norm scales ~ 1 + N(0, 0.1²); Marian's (buffer)
    logit bias random too.
    ``untie_head``: a head of its own (transformers 5 ties T5's whatever the config says; Flan-T5's is not).
    """
    cls, kwargs = CONFIGS[name]
    kwargs = dict(kwargs)
    untie_head = kwargs.pop("untie_head", False)
    config = transformers.AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(seed)
    model = cls(config).eval()
    if untie_head:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        model.all_tied_weights_keys.pop("lm_head.weight")
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if not param.requires_grad:  # Marian's sinusoid tables
                continue
            named_norm = "norm" in param_name.lower() or ".ln_" in param_name
            is_scale = param.ndim == 1 and named_norm and "bias" not in param_name
            std = 1.0 if param_name == "shared.weight" else 0.2  # T5's own N(0, 1): its tied head scales by d**-0.5
            param.copy_(1.0 + 0.1 * torch.randn_like(param) if is_scale else std * torch.randn_like(param))
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
    return model


def tokens(batch: int, length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, VOCAB - 1, (batch, length)).astype(np.int64)


def attention_mask(lengths, length: int) -> np.ndarray:
    return (np.arange(length)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)


def assert_refused_in_one_line(source, out, message: str, capsys) -> None:
    """``hf.load`` and ``jaxformer import-hf`` refuse ``source`` with ``message``: one line, exit 2, nothing written."""
    import re

    from jaxformer import hf
    from jaxformer.cli import main

    capsys.readouterr()
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        hf.load(source)
    assert main(["import-hf", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxformer import-hf: error: {message}") and len(err.strip().splitlines()) == 1
    assert not out.exists()


CHAT_TEMPLATE = "{% for m in messages %}<|begin_of_text|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def tiny_gguf(path, *, add_bos: bool | None = None, add_eos: bool | None = None, chat_template: str | None = None,
              rope_scaling: tuple[str, float] | None = None) -> None:
    """A one-block random-weight Llama GGUF with a byte-level BPE vocabulary (the 256 byte symbols, one merge, BOS 0
    and EOS 1 as control tokens), written with the ``gguf`` package; ``add_bos`` / ``add_eos``: its
    ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` (None: absent); ``chat_template``: its
    ``tokenizer.chat_template``; ``rope_scaling``: its ``llama.rope.scaling.type`` and ``.factor``."""
    import gguf
    from tokenizers import pre_tokenizers

    tokens = ["<|begin_of_text|>", "<|end_of_text|>", *sorted(pre_tokenizers.ByteLevel.alphabet()), "Ġw"]
    V, E, F, H = len(tokens), 16, 32, 2
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(E)
    writer.add_feed_forward_length(F)
    writer.add_head_count(H)
    writer.add_head_count_kv(H)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_merges(["Ġ w"])
    writer.add_token_types([3, 3] + [1] * (V - 2))
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if add_eos is not None:
        writer.add_add_eos_token(add_eos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    if rope_scaling is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling[0]))
        writer.add_rope_scaling_factor(rope_scaling[1])
    rng = np.random.default_rng(0)
    shapes = {"attn_norm.weight": (E,), "ffn_norm.weight": (E,), "attn_q.weight": (E, E), "attn_k.weight": (E, E),
              "attn_v.weight": (E, E), "attn_output.weight": (E, E), "ffn_gate.weight": (F, E),
              "ffn_up.weight": (F, E), "ffn_down.weight": (E, F)}
    writer.add_tensor("token_embd.weight", (0.2 * rng.standard_normal((V, E))).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(E, np.float32))
    for name, shape in shapes.items():
        writer.add_tensor(f"blk.0.{name}", (0.2 * rng.standard_normal(shape)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
