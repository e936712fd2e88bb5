"""The per-machine token cache: a BPE corpus tokenised once, memory-mapped by later processes; and the in-process
dataset cache reading a file again once it is edited."""

import numpy as np
import pytest

from jaxformer.train import dataset as dataset_module
from jaxformer.train.config import load_config
from jaxformer.train.dataset import prepare_dataset
from jaxformer.train.tokenizer import BPETokenizer


@pytest.fixture
def text_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i in range(10):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i}: the quick brown fox jumps over the lazy dog\n" * 40)
    return tmp_path


def _config(tmp_path, *extra):
    return load_config(None, ["data.corpus=files:*.txt", "data.tokenizer=bpe", "data.bpe_vocab_size=300",
                              "model.vocab_size=300", "data.val_fraction=0.2", "train.batch_size=2",
                              "train.seq_len=16", f"data.token_cache={tmp_path / 'cache'}", *extra])


def _as_a_new_process():
    """A new worker process starts without the in-process cache of tokenised corpora."""
    dataset_module._tokenized.cache_clear()


def test_a_bpe_corpus_is_tokenised_once_and_memory_mapped_after(text_files, monkeypatch):
    built = prepare_dataset(_config(text_files))
    entries = list((text_files / "cache").iterdir())
    assert len(entries) == 1 and len(entries[0].name) == 64
    assert sorted(p.name for p in entries[0].iterdir()) == ["info.json", "tokenizer.json", "train.bin", "val.bin"]

    _as_a_new_process()
    monkeypatch.setattr(BPETokenizer, "train", lambda *a, **k: pytest.fail("trained a BPE the cache holds"))
    cached = prepare_dataset(_config(text_files))
    assert isinstance(cached.train, np.memmap) and not cached.train.flags.writeable
    assert np.array_equal(cached.train, built.train) and np.array_equal(cached.val, built.val)
    assert cached.info == built.info and cached.val_bytes == built.val_bytes
    assert cached.tokenizer.encode("the lazy fox").tolist() == built.tokenizer.encode("the lazy fox").tolist()


def test_the_entry_depends_on_the_contents_the_split_and_the_vocabulary(text_files):
    base = prepare_dataset(_config(text_files))
    for change in (["data.split_seed=1"], ["data.val_fraction=0.4"], ["data.bpe_train_bytes=600"],
                   ["data.bpe_vocab_size=280", "model.vocab_size=280"]):
        _as_a_new_process()
        other = prepare_dataset(_config(text_files, *change))
        assert other.info["sha256"] == base.info["sha256"]
        assert not (np.array_equal(other.train, base.train) and np.array_equal(other.val, base.val))
    (text_files / "f03.txt").write_text("an edited file\n" * 30)
    _as_a_new_process()
    assert prepare_dataset(_config(text_files)).info["sha256"] != base.info["sha256"]
    assert len(list((text_files / "cache").iterdir())) == 6


def test_a_damaged_entry_is_rebuilt_and_an_unusable_cache_is_skipped(text_files):
    built = prepare_dataset(_config(text_files))
    (entry,) = (text_files / "cache").iterdir()
    (entry / "train.bin").write_bytes((entry / "train.bin").read_bytes()[:-2])  # a half-written copy
    _as_a_new_process()
    rebuilt = prepare_dataset(_config(text_files))
    _as_a_new_process()
    mapped = prepare_dataset(_config(text_files))
    assert not isinstance(rebuilt.train, np.memmap) and isinstance(mapped.train, np.memmap)
    (text_files / "blocked").write_text("a file where the cache directory would be")
    _as_a_new_process()
    skipped = prepare_dataset(_config(text_files, f"data.token_cache={text_files / 'blocked'}"))
    _as_a_new_process()
    off = prepare_dataset(_config(text_files, "data.token_cache="))
    for dataset in (rebuilt, mapped, skipped, off):
        assert np.array_equal(dataset.train, built.train) and np.array_equal(dataset.val, built.val)


def test_the_cache_directory_is_made_with_its_parents_and_its_entries_are_readable_by_every_user(text_files):
    """A cache shared by the users of a machine: ``mkdtemp``'s 0700 would keep other users' workers out."""
    prepare_dataset(_config(text_files, f"data.token_cache={text_files / 'a' / 'b' / 'cache'}"))
    (entry,) = (text_files / "a" / "b" / "cache").iterdir()
    assert entry.stat().st_mode & 0o777 == 0o755 and not entry.name.startswith(".")


def test_a_worker_reads_a_file_again_once_it_is_edited(text_files):
    """The in-process cache serves a warm worker's later runs, but not a corpus edited since."""
    byte_level = ["data.tokenizer=byte", "model.vocab_size=256"]
    before = prepare_dataset(_config(text_files, *byte_level))
    assert prepare_dataset(_config(text_files, *byte_level)) is before
    (text_files / "f05.txt").write_text("file 5, rewritten\n" * 41)
    after = prepare_dataset(_config(text_files, *byte_level))
    assert after.info["sha256"] != before.info["sha256"] and len(after.train) + len(after.val) != len(
        before.train) + len(before.val)
    assert not (text_files / "cache").exists()  # byte-level tokens are the bytes themselves: nothing cached


def test_a_saved_tokenizer_keys_the_entry_by_its_bytes(text_files):
    """A resumed run encodes with its saved ``tokenizer.json``: another vocabulary is another entry, encoded with it;
    the same bytes under another name are the same entry."""
    trained = prepare_dataset(_config(text_files))
    other = BPETokenizer.train([b"zebra quartz jumps " * 50, b"over the lazy dog " * 50], 280)
    other.save(text_files / "other.json")
    _as_a_new_process()
    resumed = prepare_dataset(_config(text_files), saved_tokenizer=text_files / "other.json")
    assert len(list((text_files / "cache").iterdir())) == 2
    assert resumed.tokenizer.encode("the lazy fox").tolist() == other.encode("the lazy fox").tolist()
    every_file = other.encode_documents([path.read_bytes() for path in sorted(text_files.glob("f*.txt"))])
    held = np.concatenate([resumed.train, resumed.val])
    assert sorted(held.tolist()) == sorted(every_file.tolist())  # every file encoded with it (split by files)
    assert not np.array_equal(held, np.concatenate([trained.train, trained.val]))

    (text_files / "copy.json").write_bytes((text_files / "other.json").read_bytes())
    _as_a_new_process()
    again = prepare_dataset(_config(text_files), saved_tokenizer=text_files / "copy.json")
    assert isinstance(again.train, np.memmap) and np.array_equal(again.train, resumed.train)
    assert len(list((text_files / "cache").iterdir())) == 2
