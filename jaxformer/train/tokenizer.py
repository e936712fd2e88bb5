"""Tokenizers: byte-level (the default, vocabulary 256) and a byte-level BPE trained locally.

Both map raw document bytes to token ids and back. The byte tokenizer is the identity on
bytes, so it round-trips anything. The BPE (Hugging Face ``tokenizers``, GPT-2's byte-level
pre-tokenizer, no special tokens) round-trips any UTF-8 text; invalid UTF-8 bytes are
replaced by U+FFFD before encoding. It is trained on the run's training documents and saved
with the run as ``tokenizer.json``, so a resumed run reads the same vocabulary back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from jaxformer.files import write_text_atomic


class ByteTokenizer:
    """Token id = byte value."""

    name = "byte"
    vocab_size = 256

    def encode(self, data: bytes | str) -> np.ndarray:
        """``[len(utf8 bytes)]`` uint8 ids."""
        raw = data.encode("utf-8") if isinstance(data, str) else data
        return np.frombuffer(raw, dtype=np.uint8)

    def encode_documents(self, documents: Sequence[bytes]) -> np.ndarray:
        """All documents' ids, concatenated (no separator), as one uint8 array."""
        return np.frombuffer(b"".join(documents), dtype=np.uint8)

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(np.asarray(list(ids), dtype=np.uint8)).decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        """``[vocab_size]`` the bytes of text each id stands for: one."""
        return np.ones(self.vocab_size, np.int64)


class BPETokenizer:
    """Byte-level BPE from the ``tokenizers`` library; ids fit uint16 (vocabulary ≤ 65,536)."""

    name = "bpe"

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()

    @classmethod
    def train(cls, documents: Iterable[bytes], vocab_size: int) -> BPETokenizer:
        """Learns ``vocab_size - 256`` merges (at most) on top of the 256 byte symbols."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[],
            show_progress=False,
        )
        tokenizer.train_from_iterator((_text(doc) for doc in documents), trainer=trainer)
        return cls(tokenizer)

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        """``path``'s tokenizer; one that ``tokenizers`` cannot read (valid JSON, but no tokenizer) raises one line
        naming it."""
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as error:  # noqa: BLE001 - tokenizers raises a plain Exception ("Model missing. at …")
            raise ValueError(f"{path}: not a tokenizer the tokenizers library reads ({error})") from None

    def save(self, path: str | Path) -> None:
        """Writes ``tokenizer.json`` atomically."""
        write_text_atomic(Path(path), self._tokenizer.to_str())

    def encode(self, data: bytes | str) -> np.ndarray:
        return np.asarray(self._tokenizer.encode(_text(data)).ids, dtype=np.uint16)

    def encode_documents(self, documents: Sequence[bytes]) -> np.ndarray:
        """All documents' ids, concatenated, as one uint16 array."""
        encodings = self._tokenizer.encode_batch([_text(doc) for doc in documents])
        parts = [np.asarray(encoding.ids, dtype=np.uint16) for encoding in encodings]
        return np.concatenate(parts) if parts else np.zeros(0, np.uint16)

    def decode(self, ids: Iterable[int]) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_bytes(self) -> np.ndarray:
        """``[vocab_size]`` the bytes of text each id stands for. Byte-level BPE (this module's, and a checkpoint's
        whose decoder is ``ByteLevel``, GPT-2's) writes each byte of a token as one character of its alphabet, so a
        token's length in characters is its length in bytes. A checkpoint's SentencePiece-style tokenizer
        (``model.init_from``) writes text: its mark ``▁`` stands for a space (the one it puts before a document's
        first word too), a byte-fallback token ``<0xNN>`` for one byte, any other token for its UTF-8 bytes.
        Special tokens (BOS, EOS…) stand for no text: 0."""
        byte_level = "ByteLevel" in json.dumps(json.loads(self._tokenizer.to_str()).get("decoder"))
        lengths = np.zeros(self.vocab_size, np.int64)
        for token, index in self._tokenizer.get_vocab().items():
            lengths[index] = len(token) if byte_level else _text_bytes(token)
        for index, added in self._tokenizer.get_added_tokens_decoder().items():
            if added.special:
                lengths[index] = 0
        return lengths


BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # SentencePiece's token for one byte of text it has no piece for


def _text_bytes(token: str) -> int:
    """Bytes of text a SentencePiece-style token stands for (`BPETokenizer.token_bytes`)."""
    return 1 if BYTE_FALLBACK.fullmatch(token) else len(token.replace("\u2581", " ").encode("utf-8"))


def _text(data: bytes | str) -> str:
    return data if isinstance(data, str) else data.decode("utf-8", errors="replace")
