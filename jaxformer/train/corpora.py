"""Corpora: where a run's text (or tokens) comes from, read deterministically and hashed.

- ``stdlib``: the running Python's standard-library ``.py`` sources (tests, ``idle_test`` and
  installed packages excluded), files sorted by relative path; ``stdlib+tests``: the same with
  the test suites, for studies that need more bytes.
- ``files:GLOB[,GLOB…]``: the user's text files (recursive ``**`` globs), sorted.
- ``synthetic-markov``: documents drawn from `jaxformer.train.markov` (entropy rate reported).
- ``tokens:PATH``: pre-tokenised ids, nanoGPT's ``.bin`` layout (a flat uint16/uint32 array):
  a directory with ``train.bin`` and ``val.bin``, or one file whose last ``val_fraction`` of
  64K-token blocks is the validation split.

Text corpora are lists of documents (name, bytes); files longer than ``data.doc_bytes`` are cut
at a newline into several documents, ``FILE#0``, ``FILE#1``… (`source_of` gives a piece's file).
``info["sha256"]`` is a hash of every name and byte read.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import sysconfig
from pathlib import Path
from typing import Literal

import numpy as np

from jaxformer.configs import POSITIVE, Range, Section, setting
from jaxformer.train.markov import MarkovConfig, make_markov_source

MARKOV_DOC_BYTES = 4096  # length of each independent stationary Markov document
TOKEN_BLOCK = 65_536  # tokens per "document" when one .bin file is split
_STDLIB_TEST_DIRS = {"test", "tests", "idle_test"}
_STDLIB_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclasses.dataclass(frozen=True)
class DataConfig(Section):
    """Where the tokens come from.

    corpus: ``stdlib`` (this Python's standard-library sources), ``stdlib+tests`` (the same with
      the standard library's own test suites, about 2.5 times the bytes), ``files:GLOB[,GLOB…]``,
      ``tokens:PATH`` (a nanoGPT ``.bin`` file, or a directory holding ``train.bin`` and
      ``val.bin``) or ``synthetic-markov`` (parameters in ``data.markov``).
    tokenizer: ``byte`` (vocabulary 256) or ``bpe`` (trained on the training split, saved with the run).
    doc_bytes: text documents longer than this are cut (at a newline) into documents of at most this size.
    val_fraction: share of files held out for validation, chosen by a hash of their names (a file cut into
      several documents is held out whole).
    token_cache: where a BPE-tokenised corpus is kept for later processes on this machine (`token_cache`);
      empty: off.
    """

    SECTION = "data"

    corpus: str = "stdlib"
    tokenizer: Literal["byte", "bpe"] = "byte"
    bpe_vocab_size: int = 1024
    bpe_train_bytes: int = setting(4_000_000, POSITIVE)
    token_dtype: Literal["uint16", "uint32"] = "uint16"
    val_fraction: float = setting(0.05, Range(0.0, 1.0, low_open=True, high_open=True))
    split_seed: int = 0
    doc_bytes: int = setting(65_536, POSITIVE)
    token_cache: str = "~/.cache/jaxformer/tokens"
    markov: MarkovConfig = dataclasses.field(default_factory=MarkovConfig)

    def check(self) -> None:
        kind, sep, rest = self.corpus.partition(":")
        if kind in ("files", "tokens") and not (sep and rest.strip()):
            raise ValueError(f"data.corpus {self.corpus!r} needs a path after '{kind}:'")
        if kind == "tokens" and self.tokenizer != "byte":
            raise ValueError(f"data.tokenizer must be byte (unused) for a pre-tokenised corpus, got {self.tokenizer!r}")
        if not (self.corpus in ("stdlib", "stdlib+tests", "synthetic-markov") or kind in ("files", "tokens")):
            raise ValueError(f"data.corpus must be stdlib, files:GLOB, tokens:PATH, synthetic-markov or stdlib+tests, "
                             f"got {self.corpus!r}")
        if self.tokenizer == "bpe" and not 256 < self.bpe_vocab_size <= 65_536:
            raise ValueError(f"data.bpe_vocab_size must be in (256, 65536], got {self.bpe_vocab_size}")


@dataclasses.dataclass(frozen=True)
class TextCorpus:
    """Documents in a fixed order; ``info`` describes the source (kind, counts, sha256, entropy)."""

    documents: list[tuple[str, bytes]]
    info: dict


@dataclasses.dataclass(frozen=True)
class TokenCorpus:
    """Already-split token ids (memory-mapped)."""

    train: np.ndarray
    val: np.ndarray
    info: dict


def load_corpus(data: DataConfig) -> TextCorpus | TokenCorpus:
    """Reads the corpus ``data.corpus`` names; missing files raise ``FileNotFoundError`` naming it."""
    kind, _, rest = data.corpus.partition(":")
    if data.corpus == "synthetic-markov":
        return markov_corpus(data)
    if kind == "tokens":
        return _token_corpus(data, Path(rest).expanduser())
    root = Path(sysconfig.get_paths()["stdlib"]) if kind != "files" else Path.cwd()
    return _text_corpus(kind, root, source_files(data), data.doc_bytes)


def source_files(data: DataConfig) -> list[Path]:
    """The files ``data.corpus`` reads, in corpus order, without reading them ([] for a generated corpus)."""
    kind, _, rest = data.corpus.partition(":")
    if data.corpus in ("stdlib", "stdlib+tests"):
        return stdlib_files(Path(sysconfig.get_paths()["stdlib"]), tests=data.corpus == "stdlib+tests")
    if kind == "files":
        return _glob_files(data.corpus, rest)
    if kind == "tokens":
        path = Path(rest).expanduser()
        return [path / "train.bin", path / "val.bin"] if path.is_dir() else [path]
    return []


def user_files(data: DataConfig) -> list[Path]:
    """The `source_files` a user may edit between two runs of one process: those of ``files:`` and ``tokens:``
    corpora. The standard library belongs to the running interpreter; walking it would stat every file at every run."""
    return source_files(data) if data.corpus.partition(":")[0] in ("files", "tokens") else []


def files_signature(files: list[Path]) -> tuple:
    """Each file's path, size and modification time: what changes when a file is edited, at the cost of a stat."""
    stats = []
    for path in files:
        try:
            stat = path.stat()
            stats.append((str(path), stat.st_size, stat.st_mtime_ns))
        except OSError:
            stats.append((str(path), None, None))
    return tuple(stats)


def stdlib_files(root: Path, *, tests: bool = False) -> list[Path]:
    """Sorted ``.py`` files under ``root``, skipping installed packages and (unless ``tests``) test suites."""
    excluded = _STDLIB_EXCLUDED_DIRS | (set() if tests else _STDLIB_TEST_DIRS)
    found = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in excluded)
        found += [Path(directory) / name for name in names if name.endswith(".py")]
    return sorted(found, key=lambda path: path.relative_to(root).as_posix())


def markov_corpus(data: DataConfig) -> TextCorpus:
    """``data.markov.bytes`` bytes (rounded up to whole documents) of the seeded chain."""
    m = data.markov
    source = make_markov_source(m.order, m.alphabet, m.branching, m.concentration, m.seed)
    num_documents = -(-m.bytes // MARKOV_DOC_BYTES)
    try:
        texts = source.sample(num_documents, MARKOV_DOC_BYTES, seed=m.seed + 1)
        rates = source.entropy_rate_bits(), source.unigram_entropy_bits()
    except ValueError as error:  # the chain's parameters are the user's: one line naming them
        raise ValueError(f"data.markov (order {m.order}, alphabet {m.alphabet}, branching {m.branching}, concentration "
                         f"{m.concentration:g}, seed {m.seed}): {error}; a larger data.markov.concentration makes such "
                         "transitions rarer") from None
    documents = [(f"markov-{i:06d}", text) for i, text in enumerate(texts)]
    info = {
        "kind": "synthetic-markov",
        "markov": dataclasses.asdict(m),
        "entropy_rate_bits_per_byte": rates[0],
        "unigram_entropy_bits_per_byte": rates[1],
    }
    return TextCorpus(documents, {**info, **_describe(documents)})


def _glob_files(spec: str, patterns: str) -> list[Path]:
    files: set[Path] = set()
    for pattern in (p.strip() for p in patterns.split(",") if p.strip()):
        matches = [Path(m) for m in glob.glob(os.path.expanduser(pattern), recursive=True) if Path(m).is_file()]
        if not matches and os.path.isdir(os.path.expanduser(pattern)):  # a glob matches the directory, not its files
            raise FileNotFoundError(f"data.corpus {spec!r}: {pattern!r} is a directory; give a glob of its files, such "
                                    f"as {os.path.join(pattern, '*.txt')!r} ({os.path.join(pattern, '**', '*.txt')!r} "
                                    "with subdirectories)")
        if not matches:
            raise FileNotFoundError(f"data.corpus {spec!r}: no file matches {pattern!r}")
        files.update(matches)
    return sorted(files, key=lambda path: path.as_posix())


def _text_corpus(kind: str, root: Path, files: list[Path], doc_bytes: int) -> TextCorpus:
    documents = []
    for path in files:
        name = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
        pieces = split_text(path.read_bytes(), doc_bytes)
        documents += [(name if len(pieces) == 1 else f"{name}#{i}", piece) for i, piece in enumerate(pieces)]
    info = {"kind": kind, "root": str(root), "files": len(files), **_describe(documents)}
    return TextCorpus(documents, info)


def source_of(name: str) -> str:
    """The file a document was cut from: ``FILE`` for ``FILE#i``, the name itself for a whole file."""
    return name.rsplit("#", 1)[0]


def split_text(text: bytes, max_bytes: int) -> list[bytes]:
    """Cuts ``text`` into pieces of at most ``max_bytes``, after the last newline when there is one."""
    pieces, start = [], 0
    while len(text) - start > max_bytes:
        cut = text.rfind(b"\n", start, start + max_bytes)
        end = cut + 1 if cut >= start else start + max_bytes
        pieces.append(text[start:end])
        start = end
    if start < len(text) or not pieces:
        pieces.append(text[start:])
    return pieces


def _describe(documents: list[tuple[str, bytes]]) -> dict:
    digest = hashlib.sha256()
    for name, text in documents:
        digest.update(name.encode() + b"\0" + len(text).to_bytes(8, "little") + text)
    return {"documents": len(documents), "bytes": sum(len(t) for _, t in documents), "sha256": digest.hexdigest()}


def _token_corpus(data: DataConfig, path: Path) -> TokenCorpus:
    dtype = np.dtype(data.token_dtype)
    if path.is_dir():
        train_path, val_path = path / "train.bin", path / "val.bin"
        for part in (train_path, val_path):
            if not part.is_file():
                raise FileNotFoundError(f"data.corpus {data.corpus!r}: {part} not found")
        train, val = _memmap(train_path, dtype, data.corpus), _memmap(val_path, dtype, data.corpus)
        files = [train_path, val_path]
    elif path.is_file():
        tokens = _memmap(path, dtype, data.corpus)
        blocks = -(-len(tokens) // TOKEN_BLOCK)
        val_blocks = max(1, round(blocks * data.val_fraction)) if blocks > 1 else 0
        cut = (blocks - val_blocks) * TOKEN_BLOCK if val_blocks else int(len(tokens) * (1 - data.val_fraction))
        train, val = tokens[:cut], tokens[cut:]
        files = [path]
    else:
        raise FileNotFoundError(f"data.corpus {data.corpus!r}: {path} not found")
    digest = hashlib.sha256()
    for file in files:
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 24), b""):
                digest.update(chunk)
    info = {"kind": "tokens", "path": str(path), "dtype": data.token_dtype, "tokens": len(train) + len(val),
            "sha256": digest.hexdigest()}
    return TokenCorpus(train, val, info)


def _memmap(path: Path, dtype: np.dtype, spec: str) -> np.ndarray:
    size = path.stat().st_size
    if size == 0 or size % dtype.itemsize:
        raise ValueError(f"data.corpus {spec!r}: {path} holds {size} bytes, not a whole number of {dtype} tokens")
    return np.memmap(path, dtype=dtype, mode="r")
