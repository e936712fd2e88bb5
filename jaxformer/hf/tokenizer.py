"""``tokenizer.json`` files (Hugging Face ``tokenizers``): a GGUF file's byte-level BPE, and jaxformer's bytes.

A checkpoint's own ``tokenizer.json`` is used as it is. A GGUF file carries its vocabulary
and merges in its metadata; `gguf_tokenizer_json` rebuilds the ``tokenizers`` BPE from them,
with the pre-tokenizer that llama.cpp names in ``tokenizer.ggml.pre``. `byte_tokenizer_json`
describes jaxformer's byte-level tokenizer (id = byte) for an export, so a model trained on
bytes is usable with ``transformers``' tokenizers too.
"""

from __future__ import annotations

from typing import Sequence

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# GGUF token types (llama.cpp's llama_token_type): control and user-defined tokens are matched whole
CONTROL, USER_DEFINED = 3, 4


def _pre_tokenizer(pre: str | None):
    """llama.cpp's ``tokenizer.ggml.pre`` as a ``tokenizers`` pre-tokenizer (None: not known here)."""
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in (None, "default", "gpt2", "gpt-2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):  # single digits, then GPT-2's split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    patterns = {"llama-bpe": LLAMA3_PATTERN, "llama3": LLAMA3_PATTERN, "qwen2": QWEN2_PATTERN}
    if pre in patterns:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(patterns[pre]), behavior="isolated"), byte_level])
    return None


def gguf_tokenizer_json(model: str, pre: str | None, tokens: Sequence[str], merges: Sequence[str],
                        token_types: Sequence[int] | None, *, bos: int | None = None, eos: int | None = None,
                        add_bos: bool = False, add_eos: bool = False) -> str | None:
    """A ``tokenizer.json`` for a GGUF byte-level BPE vocabulary (``tokenizer.ggml.model: gpt2``), else None.

    ``add_bos`` / ``add_eos`` (``tokenizer.ggml.add_bos_token`` …): every encoding starts with token ``bos`` / ends
    with ``eos``, as transformers' and llama.cpp's tokenizers of the file do (a post-processor, as in Llama 3's)."""
    if model != "gpt2":
        return None
    pre_tokenizer = _pre_tokenizer(pre)
    if pre_tokenizer is None:
        return None
    from tokenizers import AddedToken, Tokenizer, decoders, models

    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, kind in enumerate(token_types or ()) if kind in (CONTROL, USER_DEFINED)]
    if special:
        tokenizer.add_special_tokens(special)
    processor = _bos_eos_processor(tokens, bos if add_bos else None, eos if add_eos else None)
    if processor is not None:
        tokenizer.post_processor = processor
    return tokenizer.to_str()


def _bos_eos_processor(tokens: Sequence[str], bos: int | None, eos: int | None):
    """A ``TemplateProcessing`` that puts token ``bos`` before and ``eos`` after each sequence (None: neither)."""
    from tokenizers import processors

    if bos is None and eos is None:
        return None

    def around(sequence: str, segment: int) -> list[str]:
        return [*([f"{tokens[bos]}:{segment}"] if bos is not None else []), f"${sequence}:{segment}",
                *([f"{tokens[eos]}:{segment}"] if eos is not None else [])]

    return processors.TemplateProcessing(single=" ".join(around("A", 0)), pair=" ".join(around("A", 0) + around("B", 1)),
                                         special_tokens=[(tokens[i], i) for i in dict.fromkeys((bos, eos)) if i is not None])


def byte_tokenizer_json() -> str:
    """jaxformer's byte tokenizer as a ``tokenizer.json``: token id ``b`` is byte ``b``, no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_of)
    tokenizer = Tokenizer(models.BPE(vocab={symbol: _byte_of(symbol) for symbol in alphabet}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer.to_str()


def _byte_of(symbol: str) -> int:
    """GPT-2's byte-to-unicode map, inverted: printable bytes are themselves, the others start at U+0100."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    code = ord(symbol)
    return code if code in printable else others[code - 256]
