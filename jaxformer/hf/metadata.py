"""What a checkpoint's tokens mean, beside its weights: ``tokenizer.json``, ``tokenizer_config.json`` (special tokens,
chat template, with what transformers keeps beside it folded in) and ``generation_config.json`` (transformers'
generation defaults: stop tokens, sampling), read and written as `jaxformer.hf.convert` moves checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxformer.files import load_json, write_json_atomic, write_text_atomic

TOKENIZER, TOKENIZER_CONFIG = "tokenizer.json", "tokenizer_config.json"
# what transformers keeps beside tokenizer_config.json, read into it: its special tokens, its chat template
SPECIAL_TOKENS_MAP, CHAT_TEMPLATE = "special_tokens_map.json", "chat_template.jinja"
GENERATION_CONFIG = "generation_config.json"  # kept as it is: what transformers' generate does with the model


def tokenizer_config_of(path: Path) -> dict[str, Any] | None:
    """A directory's ``tokenizer_config.json`` with what transformers keeps beside it (``special_tokens_map.json``,
    ``chat_template.jinja``) folded in; None when it has none of them."""
    config: dict[str, Any] = {}
    for name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
        if (path / name).is_file():
            config = {**json_object(path / name), **config}  # tokenizer_config.json's own fields first
    if (path / CHAT_TEMPLATE).is_file():
        config.setdefault("chat_template", (path / CHAT_TEMPLATE).read_text())
    return config or None


def read_generation_config(path: str | Path) -> dict[str, Any] | None:
    """A directory's ``generation_config.json`` (a Hugging Face or import-hf directory, a run trained from a
    checkpoint: `jaxformer.hf.convert.copy_token_metadata`); None when it has none (a GGUF file)."""
    path = Path(path) / GENERATION_CONFIG
    if not path.is_file():
        return None
    return json_object(path)


def json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; anything else (malformed, an array) raises one line naming the file."""
    fields = load_json(path)
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: not a JSON object")
    return fields


def write_tokenizer(out: Path, tokenizer_json: str | None, tokenizer_config: dict[str, Any] | None) -> None:
    if tokenizer_json is not None:
        write_text_atomic(out / TOKENIZER, tokenizer_json)
    if tokenizer_config:
        write_json_atomic(out / TOKENIZER_CONFIG, tokenizer_config, sort_keys=True)


def write_generation_config(out: Path, generation_config: dict[str, Any] | None) -> None:
    if generation_config:
        write_json_atomic(out / GENERATION_CONFIG, generation_config, sort_keys=True)
