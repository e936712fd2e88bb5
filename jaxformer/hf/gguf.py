"""GGUF files (llama.cpp) through the ``gguf`` package: metadata -> config.json fields, tensors -> float32.

Supported architectures: ``llama`` (Llama, Mistral, SmolLM…) and ``qwen2``. Quantised tensors
are dequantised to float32 with ``gguf.quants.dequantize``. llama.cpp stores the ``llama``
architecture's query/key rows in the adjacent-pair RoPE layout; they are put back in the
rotate-half layout of the Hugging Face names here (`jaxformer.hf.layout.pairs_to_halves`), so
the Llama family's rules apply unchanged (two exact permutations). The vocabulary becomes a
``tokenizer.json`` (`jaxformer.hf.tokenizer`).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from jaxformer.hf.layout import pairs_to_halves

ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}  # GGUF general.architecture -> model_type
TENSORS = {  # GGUF name (after blk.N.) -> Hugging Face name (after model.layers.N.)
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                  "output.weight": "lm_head.weight"}


@contextlib.contextmanager
def _readable(path: Path) -> Iterator[None]:
    """One line naming ``path`` for what the gguf package raises on a garbled or truncated file (a bad magic, a
    tensor cut short: ``ValueError`` from it or from numpy)."""
    try:
        yield
    except ValueError as error:
        raise ValueError(f"{path}: not a readable GGUF file ({error})") from None


def _whole_reads(reader_class: type) -> type:
    """``gguf.GGUFReader`` whose reads past the end of the file raise ``ValueError``. The package's own return what
    is there, none at the end, so a 51-byte file whose array claims 2**40 elements looped (and grew a list) 2**40
    times; each element read now takes at least a byte of the file. A private override because gguf (0.19.0) offers
    no public bound: its constructor parses the whole header through ``_get``, so the declared counts are known only
    by parsing it (transformers' GGUF loader reads through the same reader unguarded)."""

    class WholeReads(reader_class):
        def _get(self, offset, dtype, count=1, override_order=None):
            value = super()._get(offset, dtype, count, override_order)
            if value.size < int(count):
                raise ValueError(f"the file ends inside a field that starts at byte {offset}")
            return value

    return WholeReads


class _Fields:
    """A GGUF file's metadata: ``fields(key)``, or ``fields(key, default)`` when the key may be absent."""

    def __init__(self, reader, path: Path) -> None:
        self._reader, self._path = reader, path

    def __call__(self, key: str, default: Any = ...) -> Any:
        if key not in self._reader.fields:
            if default is ...:
                raise ValueError(f"{self._path}: GGUF metadata {key} is missing")
            return default
        with _readable(self._path):
            return self._reader.fields[key].contents()


class GGUFTensors(Mapping[str, np.ndarray]):
    """Hugging Face name -> float32 array, dequantised when read."""

    def __init__(self, path: Path, names: dict[str, Any], heads: int, kv_heads: int, permuted: bool) -> None:
        self._path, self._names = path, names  # hf name -> gguf ReaderTensor
        self._heads, self._kv_heads, self._permuted = heads, kv_heads, permuted

    def __getitem__(self, name: str) -> np.ndarray:
        from gguf.quants import dequantize

        tensor = self._names[name]
        with _readable(self._path):
            # a plain view of the memory map: gguf's row loop pays numpy.memmap's bookkeeping on every slice otherwise
            array = np.asarray(dequantize(np.asarray(tensor.data), tensor.tensor_type), np.float32)
            array = array.reshape([int(n) for n in reversed(tensor.shape)])  # GGUF lists dimensions fastest first
        if self._permuted and (".q_proj." in name or ".k_proj." in name):
            heads = self._heads if ".q_proj." in name else self._kv_heads
            rows = array.reshape(heads, -1, *array.shape[1:])  # [heads, head_dim, (E)]
            array = pairs_to_halves(rows, axis=1).reshape(array.shape)
        return array

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def read_gguf(path: str | Path) -> tuple[dict[str, Any], GGUFTensors, str | None, dict[str, Any] | None]:
    """``(config.json fields, tensors by Hugging Face name, tokenizer.json or None, tokenizer_config.json fields or
    None)`` of a GGUF file: the fields name its special tokens and carry ``tokenizer.chat_template``, as
    transformers' tokenizer of the file has them."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ValueError("reading GGUF files needs the gguf package (pip install gguf)") from None
    from jaxformer.hf.tokenizer import gguf_tokenizer_json

    path = Path(path)
    with _readable(path):
        reader = _whole_reads(GGUFReader)(str(path))
    field = _Fields(reader, path)
    arch = field("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: GGUF metadata general.architecture={arch!r} is not supported "
                         f"(supported: {', '.join(ARCHITECTURES)})")
    experts = int(field(f"{arch}.expert_count", 0))  # Mixtral's files are of the llama architecture
    if experts:
        raise ValueError(f"{path}: GGUF metadata {arch}.expert_count={experts} is not supported "
                         "(dense feed-forward layers only)")
    names: dict[str, Any] = {}
    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":
            raise ValueError(f"{path}: GGUF tensor rope_freqs.weight (per-frequency RoPE factors) is not supported")
        match = re.fullmatch(r"blk\.(\d+)\.(.+)", tensor.name)
        if match and match.group(2) in TENSORS:
            names[f"model.layers.{match.group(1)}.{TENSORS[match.group(2)]}"] = tensor
        elif tensor.name in GLOBAL_TENSORS:
            names[GLOBAL_TENSORS[tensor.name]] = tensor
        else:
            names[f"gguf.{tensor.name}"] = tensor  # reported as unused by the importer
    tokens = field("tokenizer.ggml.tokens", [])
    vocab_size = int(field(f"{arch}.vocab_size", len(tokens)))
    if vocab_size <= 0:
        raise ValueError(f"{path}: GGUF metadata gives no vocabulary size (neither {arch}.vocab_size nor "
                         "tokenizer.ggml.tokens)")
    heads = int(field(f"{arch}.attention.head_count"))
    kv_heads = int(field(f"{arch}.attention.head_count_kv", heads))
    d_model = int(field(f"{arch}.embedding_length"))
    head_dim = int(field(f"{arch}.attention.key_length", d_model // heads))
    rope_dims = int(field(f"{arch}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(f"{path}: GGUF metadata {arch}.rope.dimension_count={rope_dims} is not supported "
                         f"(RoPE on the whole head, {head_dim})")
    config: dict[str, Any] = {
        "model_type": ARCHITECTURES[arch], "hidden_size": d_model, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "num_hidden_layers": int(field(f"{arch}.block_count")),
        "intermediate_size": int(field(f"{arch}.feed_forward_length")),
        "max_position_embeddings": int(field(f"{arch}.context_length")),
        "rms_norm_eps": float(field(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(f"{arch}.rope.freq_base", 10000.0)),
        "vocab_size": vocab_size,
        "tie_word_embeddings": "lm_head.weight" not in names, "hidden_act": "silu",
    }
    scaling = field(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(field(f"{arch}.rope.scaling.factor"))}
    elif scaling != "none":
        raise ValueError(f"{path}: GGUF metadata {arch}.rope.scaling.type={scaling!r} is not supported (none, linear)")
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        value = field(f"tokenizer.ggml.{name}_token_id", None)
        if value is not None:
            config[key] = int(value)
    tokenizer_json = None
    if tokens:
        tokenizer_json = gguf_tokenizer_json(field("tokenizer.ggml.model", ""),
                                             field("tokenizer.ggml.pre", None), tokens,
                                             field("tokenizer.ggml.merges", []),
                                             field("tokenizer.ggml.token_type", None),
                                             bos=config.get("bos_token_id"), eos=config.get("eos_token_id"),
                                             add_bos=bool(field("tokenizer.ggml.add_bos_token", False)),
                                             add_eos=bool(field("tokenizer.ggml.add_eos_token", False)))
    return (config, GGUFTensors(path, names, heads, kv_heads, permuted=arch == "llama"), tokenizer_json,
            _tokenizer_config(field, tokens, config) if tokenizer_json is not None else None)


def _tokenizer_config(field: _Fields, tokens: list[str], config: dict[str, Any]) -> dict[str, Any]:
    """``tokenizer_config.json`` fields of a GGUF vocabulary: its special tokens by name, its chat template."""
    fields: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for key, name in (("bos_token_id", "bos_token"), ("eos_token_id", "eos_token"), ("pad_token_id", "pad_token")):
        if config.get(key) is not None and 0 <= config[key] < len(tokens):
            fields[name] = tokens[config[key]]
    unknown = field("tokenizer.ggml.unknown_token_id", None)
    if unknown is not None and 0 <= int(unknown) < len(tokens):
        fields["unk_token"] = tokens[int(unknown)]
    template = field("tokenizer.chat_template", None)
    if template is not None:
        fields["chat_template"] = str(template)
    return fields
