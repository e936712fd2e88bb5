"""A BPE-tokenised corpus kept on disk once per machine, as nanoGPT's ``train.bin``/``val.bin``.

Training a BPE on the training split and encoding both splits takes seconds to minutes, and
every worker process of a sweep would pay it again (`docs/sweep-speed.md`). The
result is stored under ``data.token_cache`` in a directory named by a hash of everything it
depends on — the corpus's content hash (its names and bytes), the split, the BPE settings,
the saved tokenizer a resumed run brings, the ``tokenizers`` version — and later processes
memory-map it (read-only, its pages shared between workers). A byte-level corpus is not cached:
its tokens are its bytes, which the content hash reads anyway.

An entry is written into a temporary directory and renamed into place, so a reader sees a
whole entry or none; when two workers build the same entry, the second replaces the first
(the same tokens; a process that mapped the first keeps its files). An unwritable cache is
skipped; an entry that does not read back whole (sizes, files) is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from jaxformer.train.corpora import DataConfig
from jaxformer.train.tokenizer import BPETokenizer

FORMAT = 1  # bumped when an entry's layout or the split's rule changes


def entry_key(data: DataConfig, content_sha256: str, saved_tokenizer: Path | None) -> str:
    """The hex digest naming the entry of a corpus with content hash ``content_sha256`` split and tokenised
    under ``data`` (``saved_tokenizer``: the vocabulary to encode with instead of training one)."""
    import tokenizers

    recipe = {
        "format": FORMAT,
        "corpus_sha256": content_sha256,
        "val_fraction": data.val_fraction,
        "split_seed": data.split_seed,
        "bpe_vocab_size": data.bpe_vocab_size,
        "bpe_train_bytes": data.bpe_train_bytes,
        "saved_tokenizer_sha256": hashlib.sha256(saved_tokenizer.read_bytes()).hexdigest() if saved_tokenizer else None,
        "tokenizers": tokenizers.__version__,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def load_entry(directory: Path, key: str) -> tuple[np.ndarray, np.ndarray, BPETokenizer, dict] | None:
    """``(train, val, tokenizer, info)`` of the entry ``key``, its token arrays memory-mapped read-only; None when
    it is absent or does not read back whole."""
    entry = directory / key
    try:
        info = json.loads((entry / "info.json").read_text())
        arrays = []
        for split in ("train", "val"):
            path = entry / f"{split}.bin"
            if path.stat().st_size != 2 * info[f"{split}_tokens"]:
                return None
            arrays.append(np.memmap(path, dtype=np.uint16, mode="r") if info[f"{split}_tokens"] else
                          np.zeros(0, np.uint16))
        tokenizer = BPETokenizer.load(entry / "tokenizer.json")
    except Exception:  # missing or short files, bad JSON, and tokenizers' bare Exception for a bad tokenizer.json
        return None
    return arrays[0], arrays[1], tokenizer, info


def store_entry(directory: Path, key: str, train: np.ndarray, val: np.ndarray, tokenizer: BPETokenizer,
                info: dict) -> None:
    """Writes the entry ``key`` whole or not at all, in place of a damaged one; an unwritable cache is left as
    it was. Readers of a replaced entry keep their mapped files."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=directory, prefix=f".{key}."))
    except OSError:
        return
    try:
        np.asarray(train, np.uint16).tofile(staging / "train.bin")
        np.asarray(val, np.uint16).tofile(staging / "val.bin")
        tokenizer.save(staging / "tokenizer.json")
        (staging / "info.json").write_text(json.dumps(info, indent=2) + "\n")
        os.chmod(staging, 0o755)  # mkdtemp creates 0700
        shutil.rmtree(directory / key, ignore_errors=True)  # a damaged entry `load_entry` refused
        os.rename(staging, directory / key)
    except OSError:  # unwritable, or another worker's entry (the same) renamed in between
        shutil.rmtree(staging, ignore_errors=True)
