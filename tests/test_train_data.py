"""Training data: tokenizers, corpora, the split, the size checks and the loader (the Markov source: test_markov.py)."""

import hashlib
import json
import math

import numpy as np
import pytest

from jaxformer.train.config import load_config
from jaxformer.train.corpora import DataConfig
from jaxformer.train.corpora import load_corpus, source_of, split_text, stdlib_files
from jaxformer.train.dataset import Dataset, _prefix, check_sizes, prepare_dataset, validation_mask
from jaxformer.train.loader import Loader, eval_batches
from jaxformer.train.tokenizer import BPETokenizer, ByteTokenizer

SAMPLES = ["", "plain ascii\n", "  leading and trailing spaces  ", "tabs\tand\r\nCRLF\n\n",
           "ünïcödé — “quotes” 日本語 한국어 🚀🧪", "def f(x):\n    return x ** 2  # comment\n", "\x00\x01 control"]


def test_byte_tokenizer_round_trips_any_utf8():
    tokenizer = ByteTokenizer()
    for text in SAMPLES:
        ids = tokenizer.encode(text)
        assert len(ids) == len(text.encode()) and ids.max(initial=0) < 256
        assert tokenizer.decode(ids) == text


def test_bpe_round_trip_compression_and_save(tmp_path):
    corpus = [("def function_%d(value):\n    return value * %d  # ünïcödé\n" % (i, i)).encode() * 20 for i in range(50)]
    tokenizer = BPETokenizer.train(corpus, vocab_size=400)
    assert 256 < tokenizer.vocab_size <= 400
    for text in SAMPLES + ["unseen words: zyzzyva qoph", corpus[3].decode()]:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    ids = tokenizer.encode(corpus[0])
    assert len(ids) < len(corpus[0]) / 2  # the merges compress text like the training data
    tokenizer.save(tmp_path / "tokenizer.json")
    reloaded = BPETokenizer.load(tmp_path / "tokenizer.json")
    assert np.array_equal(reloaded.encode(corpus[7]), tokenizer.encode(corpus[7]))


def test_stdlib_corpus_is_sorted_hashed_and_excludes_tests():
    corpus = load_corpus(DataConfig(corpus="stdlib"))
    names = [name for name, _ in corpus.documents]
    files = [name.split("#")[0] for name in names]  # long files are cut into name#0, name#1, …
    assert files == sorted(files) and len(set(files)) == corpus.info["files"] > 500
    assert not any(part in ("test", "tests", "idle_test", "site-packages")
                   for name in names for part in name.split("/"))
    assert 8e6 < corpus.info["bytes"] < 30e6
    assert load_corpus(DataConfig(corpus="stdlib")).info["sha256"] == corpus.info["sha256"]
    from pathlib import Path
    assert len(stdlib_files(Path(corpus.info["root"]))) == corpus.info["files"]


def test_stdlib_with_tests_adds_the_test_suites_and_only_them():
    plain, more = load_corpus(DataConfig(corpus="stdlib")), load_corpus(DataConfig(corpus="stdlib+tests"))
    plain_names = {name for name, _ in plain.documents}
    extra = [name for name, _ in more.documents if name not in plain_names]
    assert plain_names <= {name for name, _ in more.documents}
    assert extra and all({"test", "tests", "idle_test"} & set(name.split("/")) for name in extra)
    assert more.info["bytes"] > 2 * plain.info["bytes"] and more.info["sha256"] != plain.info["sha256"]


def test_split_text_cuts_at_newlines():
    assert split_text(b"ab\ncd\nef", 4) == [b"ab\n", b"cd\n", b"ef"]
    assert split_text(b"abcdefgh", 3) == [b"abc", b"def", b"gh"]
    assert b"".join(split_text(b"x\n" * 1000, 64)) == b"x\n" * 1000


def test_split_is_by_document_stable_and_holds_some_out():
    names = [f"doc{i}.txt" for i in range(2000)]
    mask = validation_mask(names, 0.05, seed=0)
    assert 60 < mask.sum() < 140
    # adding documents never moves an existing one between the splits
    assert np.array_equal(validation_mask(names + ["new.txt"], 0.05, seed=0)[:-1], mask)
    assert not np.array_equal(validation_mask(names, 0.05, seed=1), mask)
    assert validation_mask(["a", "b"], 0.001, seed=0).sum() == 1  # at least one held out


def _split_key(seed: int, file: str) -> float:
    """The split's documented key of a file: the first 8 bytes of sha256("seed:file") as a fraction of 2^64."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{file}".encode()).digest()[:8], "big") / 2.0**64


def test_a_split_that_would_hold_out_no_file_holds_out_the_lowest_keyed_and_one_holding_all_keeps_the_highest():
    """A file is held out when its key is below ``val_fraction``; where none is, the lowest-keyed file is, and where
    every file is, the highest-keyed one trains (several files: never all held out)."""
    names = [f"f{i}.txt" for i in range(6)]
    keys = np.array([_split_key(3, name) for name in names])
    assert np.array_equal(validation_mask(names, 0.5, seed=3), keys < 0.5) and 0 < (keys < 0.5).sum() < 6
    assert np.array_equal(validation_mask(names, keys.min() / 2, seed=3), keys == keys.min())
    assert np.array_equal(validation_mask(names, (1 + keys.max()) / 2, seed=3), keys != keys.max())
    pair = ["a.txt", "b.txt"]
    assert validation_mask(pair, 0.99999, seed=3).tolist() == [_split_key(3, "a.txt") < _split_key(3, "b.txt"),
                                                               _split_key(3, "a.txt") > _split_key(3, "b.txt")]
    assert validation_mask(["only.txt"], 0.999, seed=3).tolist() == [True]  # one document: held out (then refused)


def test_the_bpe_trains_on_the_leading_documents_within_its_byte_budget_and_at_least_the_first():
    documents = [b"aaaa", b"bb", b"cc", b"d"]
    assert _prefix(documents, 6) == [b"aaaa", b"bb"] and _prefix(documents, 9) == documents
    assert _prefix(documents, 5) == [b"aaaa"] and _prefix(documents, 3) == [b"aaaa"]


def test_a_file_cut_into_pieces_goes_whole_to_one_split():
    """The pieces of one long file share its names, imports and style, so a held-out piece of a file whose other
    pieces are trained on is easier than unseen text: files go to a split whole. On the stdlib corpus (whose
    pieces were split one by one until session 31: 30% of its validation bytes came from files with pieces in
    training) no file has pieces on both sides. A corpus of a single file is still split, by its pieces."""
    def sides(names, mask):
        held = {}
        for name, is_val in zip(names, mask):
            held.setdefault(source_of(name), set()).add(bool(is_val))
        return held

    names = [f"big{i}.py#{j}" for i in range(300) for j in range(5)] + [f"small{i}.py" for i in range(300)]
    held = sides(names, validation_mask(names, 0.1, seed=0))
    assert all(len(s) == 1 for s in held.values()) and 30 < sum(s == {True} for s in held.values()) < 90
    config = DataConfig(corpus="stdlib")
    names = [name for name, _ in load_corpus(config).documents]
    held = sides(names, validation_mask(names, config.val_fraction, config.split_seed))
    cut = {source_of(name) for name in names if name != source_of(name)}
    assert all(len(s) == 1 for s in held.values()) and any(held[file] == {True} for file in cut)
    one_file = [f"input.txt#{j}" for j in range(100)]
    assert 0 < validation_mask(one_file, 0.1, seed=0).sum() < 100


def test_files_corpus_with_bpe_keeps_splits_apart_and_reuses_the_saved_tokenizer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i in range(12):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i}: the quick brown fox jumps over the lazy dog\n" * 40)
    config = load_config(None, ["data.corpus=files:*.txt", "data.tokenizer=bpe", "data.bpe_vocab_size=300",
                                "model.vocab_size=300", "data.val_fraction=0.2", "train.batch_size=2",
                                "train.seq_len=16"])
    dataset = prepare_dataset(config)
    info = dataset.info
    assert info["train_documents"] + info["val_documents"] == 12 and info["val_documents"] >= 1
    assert dataset.tokens_per_byte < 0.5  # BPE: fewer tokens than bytes
    assert dataset.bits_per_byte(math.log(2)) == pytest.approx(dataset.tokens_per_byte)
    dataset.tokenizer.save(tmp_path / "tokenizer.json")
    again = prepare_dataset(config, tmp_path / "tokenizer.json")
    assert np.array_equal(again.train, dataset.train) and np.array_equal(again.val, dataset.val)


def test_the_splits_are_the_files_bytes_whole_files_in_corpus_order(tmp_path, monkeypatch):
    """Byte-level streams read against the files: each file's bytes go whole to one split (cut into 3-4 documents
    of at most 100 bytes, its pieces still stay together), each split is its files' bytes concatenated in sorted
    order, and validation holds the files `validation_mask` picks."""
    monkeypatch.chdir(tmp_path)
    texts = {f"f{i:02d}.txt": "".join(f"file {i} line {j}: {'xyz'[j % 3] * (i + j)}\n" for j in range(12)).encode()
             for i in range(16)}
    for name, text in texts.items():
        (tmp_path / name).write_bytes(text)
    config = load_config(None, ["data.corpus=files:*.txt", "data.tokenizer=byte", "model.vocab_size=256",
                                "data.doc_bytes=100", "data.val_fraction=0.25", "data.split_seed=3",
                                "train.batch_size=2", "train.seq_len=16"])
    dataset = prepare_dataset(config)
    train, val = dataset.train.astype(np.uint8).tobytes(), dataset.val.astype(np.uint8).tobytes()
    held = sorted(name for name, text in texts.items() if text in val)
    assert 0 < len(held) < len(texts) and dataset.info["val_documents"] > len(held)  # pieces of several files
    assert val == b"".join(texts[name] for name in held) and dataset.val_bytes == len(val)
    assert train == b"".join(text for name, text in texts.items() if name not in held)
    names = [name for name, _ in load_corpus(config.data).documents]
    mask = validation_mask(names, config.data.val_fraction, config.data.split_seed)
    assert held == sorted({source_of(name) for name, is_val in zip(names, mask) if is_val})


def test_bpe_bits_per_byte_count_the_bytes_of_the_tokens_scored(tmp_path, monkeypatch):
    """A loss is a mean over the validation windows scored, whose text need not compress as the whole split does:
    bits per byte divide by the bytes those tokens stand for. Each id's bytes (`token_bytes`) add up to the text's
    UTF-8 length, and two texts the BPE compresses differently get their own ratios."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "easy.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    (tmp_path / "hard.txt").write_text("".join(f"{i * 7919 % 10007:05d}ß\n" for i in range(1500)))
    config = load_config(None, ["data.corpus=files:*.txt", "data.tokenizer=bpe", "data.bpe_vocab_size=400",
                                "model.vocab_size=400", "train.batch_size=2", "train.seq_len=16"])
    dataset = prepare_dataset(config)
    token_bytes = dataset.tokenizer.token_bytes()
    for text in ("the quick brown fox\n", "12345ß\n09876ß\n", "über straße"):
        assert token_bytes[dataset.tokenizer.encode(text)].sum() == len(text.encode())
    easy, hard = dataset.tokenizer.encode("the lazy dog\n" * 20), dataset.tokenizer.encode("31337ß\n" * 20)
    for targets, text_bytes in ((easy, 13 * 20), (hard, 8 * 20)):
        assert dataset.bits_per_byte(math.log(2), dataset.scored_tokens_per_byte(targets)) == pytest.approx(
            len(targets) / text_bytes)
    assert dataset.scored_tokens_per_byte(easy) != dataset.scored_tokens_per_byte(hard)
    assert ByteTokenizer().token_bytes().tolist() == [1] * 256


def sentencepiece_tokenizer_json() -> str:
    """A Llama 2-style tokenizer.json, as a ``model.init_from`` checkpoint brings (SentencePiece converted): words
    marked with ``▁``, bytes it has no piece for as byte-fallback tokens ``<0xNN>``, a BOS ``<s>`` before each text."""
    from tokenizers import SentencePieceBPETokenizer, Tokenizer, processors

    trained = SentencePieceBPETokenizer()
    trained.train_from_iterator(["le café était très animé où les élèves mangeaient des crêpes"] * 20,
                                vocab_size=120, special_tokens=["<unk>", "<s>"], show_progress=False)
    spec = json.loads(trained.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"].update(byte_fallback=True, unk_token=None)
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return tokenizer.to_str()


def test_sentencepiece_bits_per_byte_count_the_bytes_of_the_text(tmp_path, monkeypatch):
    """A checkpoint's SentencePiece-style tokenizer writes text, not GPT-2's byte alphabet: its tokens stand for
    their text's UTF-8 bytes (``▁`` a space, ``<0xC3>`` one byte, the BOS none), so bits per byte divide by the
    text's UTF-8 length plus the space ``▁`` marks before its first word (they counted characters: 'é' one byte,
    '<0xC3>' six, '<s>' three)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tokenizer.json").write_text(sentencepiece_tokenizer_json())
    for i in range(6):
        (tmp_path / f"f{i}.txt").write_text(f"le café {i} über straße 東京 🚀\n" * 30)
    config = load_config(None, ["data.corpus=files:*.txt", "data.tokenizer=bpe", "data.bpe_vocab_size=400",
                                "model.vocab_size=400", "data.token_cache=", "train.batch_size=2", "train.seq_len=16"])
    dataset = prepare_dataset(config, tmp_path / "tokenizer.json")
    for text in ("le café über straße 東京", "élèves\nmangeaient 🚀", "the cat"):
        ids = dataset.tokenizer.encode(text)
        assert dataset.bits_per_byte(math.log(2), dataset.scored_tokens_per_byte(ids)) == pytest.approx(
            len(ids) / (len(text.encode()) + 1))


def test_tokens_corpus_reads_nanogpt_bins(tmp_path):
    rng = np.random.default_rng(0)
    train = rng.integers(0, 999, 5000).astype(np.uint16)
    train[0] = 999  # the largest id, first in the file
    train.tofile(tmp_path / "train.bin")
    rng.integers(0, 999, 700).astype(np.uint16).tofile(tmp_path / "val.bin")
    config = load_config(None, [f"data.corpus=tokens:{tmp_path}", "model.vocab_size=1000",
                                "train.batch_size=4", "train.seq_len=32"])
    dataset = prepare_dataset(config)
    assert len(dataset.train) == 5000 and len(dataset.val) == 700 and dataset.bits_per_byte(1.0) is None
    small = load_config(None, [f"data.corpus=tokens:{tmp_path}", "model.vocab_size=999"])
    with pytest.raises(ValueError, match=r"^data\.corpus 'tokens:.*' holds token id 999, beyond model\.vocab_size=999$"):
        prepare_dataset(small)


def test_loader_resumes_the_same_stream_across_epochs():
    tokens = np.arange(3000, dtype=np.uint16)
    loader = Loader(tokens, seq_len=16, batch_size=8, seed=5)
    batches = [loader.next_batch() for _ in range(60)]  # 480 samples: past two epochs of 186 windows
    assert batches[0].shape == (8, 17) and batches[0].dtype == np.int32
    assert all(np.array_equal(b[:, 1:], b[:, :-1] + 1) for b in batches)  # consecutive tokens
    resumed = Loader(tokens, seq_len=16, batch_size=8, seed=5)
    state = {**loader.state_dict(), "position": 8 * 23}
    resumed.load_state_dict(state)
    assert all(np.array_equal(resumed.next_batch(), batches[i]) for i in range(23, 60))
    starts, n = np.concatenate(batches)[:, 0], loader.num_windows
    assert n == 186  # every window that fits whatever the epoch's offset: (3000 - 16) // 16
    offsets, orders = [], []
    for epoch in range(2):  # an epoch visits every window of its cut once: offset + i * seq_len, i < n
        visited = starts[epoch * n : (epoch + 1) * n]
        offsets.append(int(visited.min()))
        assert 0 <= offsets[-1] < 16 and np.array_equal(np.sort(visited), offsets[-1] + np.arange(n) * 16)
        orders.append((visited - offsets[-1]) // 16)
    assert offsets[0] != offsets[1]  # each epoch its own cut (seed 5: offsets 10 and 2)
    assert np.mean(orders[0] == orders[1]) < 0.1  # and its own order (a shuffle, not the same one again)
    assert not np.array_equal(orders[0], np.arange(n))
    other = Loader(tokens, seq_len=16, batch_size=8, seed=6)
    assert not np.array_equal(other.next_batch(), batches[0])
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(loader.state_dict())


def test_eval_batches_are_the_leading_windows_whatever_the_batch_size():
    """The windows scored are the first that fit ``max_tokens``, whatever the batch size: batches are the largest
    divisor of the window count up to it (until session 31 the count was cut to a multiple of the batch size,
    so runs of different batch sizes were scored on different tokens)."""
    tokens = np.arange(1000, dtype=np.uint16)
    batches = eval_batches(tokens, seq_len=10, batch_size=4, max_tokens=95)
    assert batches.shape == (3, 3, 11)  # 9 windows fit the budget
    assert np.array_equal(batches.reshape(-1, 11)[:, 0], np.arange(9) * 10)
    tokens = np.arange(131_073, dtype=np.int32)
    for batch_size, shape in ((32, (32, 32)), (48, (32, 32)), (100, (16, 64)), (384, (4, 256)), (16, (64, 16))):
        batches = eval_batches(tokens, seq_len=128, batch_size=batch_size, max_tokens=131_072)
        assert batches.shape == (*shape, 129), batch_size
        assert np.array_equal(batches.reshape(-1, 129)[:, 0], np.arange(1024) * 128)


def test_eval_batches_take_the_windows_a_short_stream_holds_in_batches_no_larger_than_asked():
    """A stream of ``n`` tokens holds ``(n − 1) // seq_len`` windows of ``seq_len + 1`` (each overlapping the next by
    one token); a prime count of windows beyond the batch size goes one window per batch."""
    for length, windows in ((100, 9), (101, 10), (109, 10), (110, 10), (111, 11)):
        batches = eval_batches(np.arange(length), seq_len=10, batch_size=windows, max_tokens=10_000)
        assert batches.shape == (1, windows, 11), length
        assert batches[0, -1, -1] == windows * 10  # the last window ends on the stream's token windows·seq_len
    assert eval_batches(np.arange(71), seq_len=10, batch_size=4, max_tokens=10_000).shape == (7, 1, 11)
    assert eval_batches(np.arange(61), seq_len=10, batch_size=5, max_tokens=10_000).shape == (2, 3, 11)
    assert eval_batches(np.arange(61), seq_len=10, batch_size=5, max_tokens=5).shape == (1, 1, 11)  # at least one


def test_a_corpus_must_fill_one_batch_and_its_shift_for_training_and_one_window_for_validation():
    """``(batch + 1) · seq_len + 1`` training tokens (a batch of windows and the loader's shift of up to one) and
    ``seq_len + 1`` validation tokens are enough; a token fewer of either is refused naming the counts."""
    config = load_config(None, ["train.batch_size=3", "train.seq_len=8", "data.corpus=synthetic-markov"])

    def sizes(train: int, val: int) -> None:
        check_sizes(config, Dataset(np.zeros(train, np.uint16), np.zeros(val, np.uint16), None, None, {}))

    sizes(33, 9)
    with pytest.raises(ValueError, match=r"^data\.corpus 'synthetic-markov': the training split has 32 tokens, fewer "
                                         r"than one batch needs \(33 for train\.batch_size=3 × train\.seq_len=8\)$"):
        sizes(32, 9)
    with pytest.raises(ValueError, match=r"^data\.corpus 'synthetic-markov': the validation split has 8 tokens, fewer "
                                         r"than one window of train\.seq_len=8 \+ 1$"):
        sizes(33, 8)


def test_the_loader_streams_a_corpus_of_one_window_and_refuses_one_too_short_for_any():
    """``2·seq_len`` tokens hold one window at every epoch's offset; one token fewer holds none."""
    loader = Loader(np.arange(16), seq_len=8, batch_size=3, seed=0)
    assert loader.num_windows == 1
    for batch in (loader.next_batch(), loader.next_batch()):
        assert batch.shape == (3, 9) and (batch[:, 1:] - batch[:, :-1] == 1).all() and batch.max() <= 15
    with pytest.raises(ValueError, match=r"^a stream of 15 tokens holds no window of 8 \+ 1 tokens$"):
        Loader(np.arange(15), seq_len=8, batch_size=3, seed=0)


def test_one_tokens_file_holds_out_its_last_blocks_of_65536_tokens(tmp_path):
    """``tokens:FILE``: the last ``val_fraction`` of its 64K-token blocks (rounded, at least one) is the validation
    split; a file of one block holds out its last ``val_fraction`` of tokens; a file that is no whole number of
    tokens is refused naming it."""
    ids = np.arange(10 * 65_536 + 100, dtype=np.uint32) % 70_000  # 11 blocks, the last one short
    ids.tofile(tmp_path / "big.bin")
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "small.bin")
    (tmp_path / "odd.bin").write_bytes(b"\0" * 7)

    def splits(name, *overrides):
        config = load_config(None, [f"data.corpus=tokens:{tmp_path / name}", "model.vocab_size=70000",
                                    "train.batch_size=4", "train.seq_len=32", *overrides])
        dataset = prepare_dataset(config)
        return np.asarray(dataset.train), np.asarray(dataset.val)

    train, val = splits("big.bin", "data.token_dtype=uint32", "data.val_fraction=0.25")  # round(11 × 0.25) = 3 blocks
    assert np.array_equal(train, ids[:8 * 65_536]) and np.array_equal(val, ids[8 * 65_536:])
    train, val = splits("small.bin", "data.val_fraction=0.1")
    assert np.array_equal(train, np.arange(900)) and np.array_equal(val, np.arange(900, 1000))
    with pytest.raises(ValueError, match="odd.bin holds 7 bytes, not a whole number of uint16 tokens"):
        splits("odd.bin")
