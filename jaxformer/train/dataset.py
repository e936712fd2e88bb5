"""From a corpus to the two token streams a run reads: the split by file, tokenization, checks.

A file goes to validation when a hash of ``(data.split_seed, its name)`` falls below
``data.val_fraction`` — deterministic, independent of the order and number of other
files, so adding files never moves an existing one between splits. A long file cut into
several documents goes whole to one split: its pieces share names, imports and style, so a
piece trained on would make another held out easier than unseen text (until session 31 the
pieces were split one by one, and 30% of the stdlib's validation bytes came from files with
pieces in training); a corpus of one file is split by its pieces. At least one file is held
out. Each split's documents are concatenated in corpus order without a separator (byte
vocabularies have no spare id for one).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
from pathlib import Path

import numpy as np

from jaxformer.train.config import TrainConfig
from jaxformer.train.corpora import DataConfig, TextCorpus, files_signature, load_corpus, source_of, user_files
from jaxformer.train.token_cache import entry_key, load_entry, store_entry
from jaxformer.train.tokenizer import BPETokenizer, ByteTokenizer


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Token streams of the two splits and what is known about them.

    val_bytes: bytes of validation text (None for a pre-tokenised corpus), so that over the whole split
    bits/byte = nats/token / ln 2 × ``len(val) / val_bytes``; `scored_tokens_per_byte` counts the bytes of
    the tokens a loss was taken over.
    """

    train: np.ndarray
    val: np.ndarray
    val_bytes: int | None
    tokenizer: ByteTokenizer | BPETokenizer | None
    info: dict

    @property
    def tokens_per_byte(self) -> float | None:
        return len(self.val) / self.val_bytes if self.val_bytes else None

    def scored_tokens_per_byte(self, targets: np.ndarray) -> float | None:
        """Tokens per byte of the text the token ids ``targets`` stand for (None for a pre-tokenised corpus). With
        BPE the scored tokens' bytes matter: the leading validation windows need not compress as the split does."""
        return targets.size / self.tokenizer.token_bytes()[targets].sum() if self.val_bytes else None

    def bits_per_byte(self, nats_per_token: float, tokens_per_byte: float | None = None) -> float | None:
        """``nats_per_token`` in bits per byte of text, at ``tokens_per_byte`` (default the whole validation
        split's; `scored_tokens_per_byte` for the windows a loss was taken over); None for a pre-tokenised corpus."""
        per_byte = self.tokens_per_byte if tokens_per_byte is None else tokens_per_byte
        return None if per_byte is None else nats_per_token / math.log(2) * per_byte


def validation_mask(names: list[str], val_fraction: float, seed: int) -> np.ndarray:
    """``[len(names)]`` bool: True for held-out documents, whole files at a time (`source_of`): at least one
    file, never all when there are several. A corpus of one file (nanoGPT's Shakespeare) is split by its pieces."""
    files = [source_of(name) for name in names]
    if len(set(files)) == 1:
        files = names
    keys = np.array([_unit_hash(f"{seed}:{file}") for file in files])
    is_val = keys < val_fraction
    if not is_val.any() and len(names):
        is_val = keys == keys.min()
    if is_val.all() and len(set(files)) > 1:
        is_val = keys != keys.max()
    return is_val


def prepare_dataset(config: TrainConfig, saved_tokenizer: Path | None = None) -> Dataset:
    """Loads, splits and tokenizes ``config.data``; checks it against the model and batch shape.

    saved_tokenizer: a run's ``tokenizer.json`` to reuse (resume) instead of training a BPE.
    Raises ``ValueError``/``FileNotFoundError`` naming ``data.corpus`` on unusable data.
    """
    saved = saved_tokenizer if saved_tokenizer is not None and saved_tokenizer.is_file() else None
    inputs = files_signature(user_files(config.data) + ([saved] if saved else []))
    dataset = _tokenized(config.data, os.getcwd(), saved, inputs)
    if dataset.tokenizer is None:  # a pre-tokenised corpus: its ids must fit the model
        top = max(_max_token(dataset.train), _max_token(dataset.val))
        if top >= config.model.vocab_size:
            raise ValueError(f"data.corpus {config.data.corpus!r} holds token id {top}, "
                             f"beyond model.vocab_size={config.model.vocab_size}")
    check_sizes(config, dataset)
    return dataset


@functools.lru_cache(maxsize=4)
def _tokenized(data: DataConfig, cwd: str, saved_tokenizer: Path | None, inputs: tuple) -> Dataset:
    """The split, tokenised corpus of ``data``; a warm sweep worker builds it once for all its runs.

    The key holds what the result depends on: the settings, the working directory (relative globs), the
    saved tokenizer, and the ``inputs``' `files_signature` (a user's file edited between two runs is read again).
    Arrays are read-only, shared by the runs.
    """
    corpus = load_corpus(data)
    if isinstance(corpus, TextCorpus):
        dataset = _tokenize(data, corpus, saved_tokenizer)
    else:
        dataset = Dataset(corpus.train, corpus.val, None, None, corpus.info)
    for array in (dataset.train, dataset.val):
        array.flags.writeable = False
    return dataset


def check_sizes(config: TrainConfig, dataset: Dataset) -> None:
    """The training split must fill one batch of windows, the validation split one window."""
    batch, seq_len = config.train.batch_size, config.train.seq_len
    needed = (batch + 1) * seq_len + 1  # batch windows plus the loader's shift of up to one window
    if len(dataset.train) < needed:
        raise ValueError(
            f"data.corpus {config.data.corpus!r}: the training split has {len(dataset.train):,} tokens, fewer than "
            f"one batch needs ({needed:,} for train.batch_size={batch} × train.seq_len={seq_len})"
        )
    if len(dataset.val) < seq_len + 1:
        raise ValueError(
            f"data.corpus {config.data.corpus!r}: the validation split has {len(dataset.val):,} tokens, "
            f"fewer than one window of train.seq_len={seq_len} + 1"
        )


def _tokenize(data: DataConfig, corpus: TextCorpus, saved_tokenizer: Path | None) -> Dataset:
    """A BPE corpus comes from the machine's `token_cache` when it holds this corpus, split and vocabulary."""
    if data.tokenizer == "byte" or not data.token_cache:
        return _split_and_encode(data, corpus, saved_tokenizer)
    directory = Path(data.token_cache).expanduser()
    key = entry_key(data, corpus.info["sha256"], saved_tokenizer)
    cached = load_entry(directory, key)
    if cached is not None:
        train, val, tokenizer, info = cached
        return Dataset(train, val, info["val_bytes"], tokenizer, {**info, **corpus.info})
    dataset = _split_and_encode(data, corpus, saved_tokenizer)
    store_entry(directory, key, dataset.train, dataset.val, dataset.tokenizer, dataset.info)
    return dataset


def _split_and_encode(data: DataConfig, corpus: TextCorpus, saved_tokenizer: Path | None) -> Dataset:
    names = [name for name, _ in corpus.documents]
    is_val = validation_mask(names, data.val_fraction, data.split_seed)
    if is_val.all():
        raise ValueError(f"data.corpus {data.corpus!r} has a single document of at most "
                         f"data.doc_bytes={data.doc_bytes}; lower data.doc_bytes to split it for validation")
    train_docs = [text for (_, text), val in zip(corpus.documents, is_val) if not val]
    val_docs = [text for (_, text), val in zip(corpus.documents, is_val) if val]
    if data.tokenizer == "byte":
        tokenizer = ByteTokenizer()
    elif saved_tokenizer is not None:
        tokenizer = BPETokenizer.load(saved_tokenizer)
    else:
        tokenizer = BPETokenizer.train(_prefix(train_docs, data.bpe_train_bytes), data.bpe_vocab_size)
    info = {
        **corpus.info,
        "train_documents": len(train_docs),
        "val_documents": len(val_docs),
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
    }
    train, val = tokenizer.encode_documents(train_docs), tokenizer.encode_documents(val_docs)
    info.update(train_tokens=len(train), val_tokens=len(val), val_bytes=sum(map(len, val_docs)))
    return Dataset(train, val, info["val_bytes"], tokenizer, info)


def _prefix(documents: list[bytes], max_bytes: int) -> list[bytes]:
    """The leading documents holding at most ``max_bytes`` (at least one)."""
    taken, total = [], 0
    for text in documents:
        if taken and total + len(text) > max_bytes:
            break
        taken.append(text)
        total += len(text)
    return taken


def _max_token(tokens: np.ndarray) -> int:
    chunk = 1 << 24
    return max((int(tokens[i : i + chunk].max()) for i in range(0, len(tokens), chunk)), default=-1)


def _unit_hash(text: str) -> float:
    """A number in [0, 1) from the first 8 bytes of sha256(text)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2.0**64
