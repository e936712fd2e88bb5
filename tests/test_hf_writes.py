"""What ``import-hf`` and ``export-hf`` leave behind when a write fails or the input is garbled: one line, the right
exit code, and no half-written ``--out``; what they leave when they succeed: files readable by all (0644); which
files of a checkpoint directory the weights are read from (transformers' choice; a shard index's stay inside it)."""

from __future__ import annotations

import errno
import resource
import stat
from pathlib import Path

import numpy as np
import pytest

from jaxformer import files, hf
from jaxformer.cli import main
from jaxformer.hf import convert
from jaxformer.models import ModelConfig, init_params

LLAMA = ModelConfig(vocab_size=96, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=40,
                    activation="swiglu", norm="rmsnorm", position="rope", use_bias=False, tie_embeddings=False)


@pytest.fixture
def source(tmp_path) -> Path:
    """A random-weight Llama as a Hugging Face directory (``model.safetensors`` of about 90 kB)."""
    return hf.save(LLAMA, init_params(LLAMA, 0)[1], tmp_path / "source")


def _argv(command: str, source: Path, out: Path) -> list[str]:
    return [command, str(source), "--out", str(out)]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def _left_in(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


@pytest.mark.parametrize("command", ["import-hf", "export-hf"])
def test_a_disk_full_mid_write_leaves_no_out_and_a_rerun_writes_it(command, source, tmp_path, capsys, monkeypatch):
    """The weights were written, then a text file hit a full disk: --out kept the weights alone, and the rerun was
    refused ("exists and is not empty"). Here the first JSON file written (hf.json, config.json) fills the disk
    half way through, in the atomic writer itself."""
    out = tmp_path / "out"

    def full(path, text):
        def half_then_full(handle):
            handle.write(text[:len(text) // 2].encode())
            raise OSError(errno.ENOSPC, "No space left on device")

        files.write_atomically(path, half_then_full)

    monkeypatch.setattr(files, "write_text_atomic", full)  # what write_json_atomic writes through
    assert main(_argv(command, source, out)) == 1
    written = "hf.json" if command == "import-hf" else "config.json"
    assert f"[Errno 28] No space left on device: '{out / written}'" in _one_line(capsys)
    assert _left_in(tmp_path) == ["source"]  # no --out, no temporary directory beside it
    monkeypatch.undo()
    assert main(_argv(command, source, out)) == 0
    expected = ["hf.json", "model.yaml", "params.safetensors"] if command == "import-hf" else ["config.json",
                                                                                              "model.safetensors"]
    assert _left_in(out) == expected


@pytest.mark.parametrize(("command", "weights"), [("import-hf", "params.safetensors"),
                                                  ("export-hf", "model.safetensors")])
def test_a_file_too_large_is_one_line_exit_1_and_leaves_no_out(command, weights, source, tmp_path, capsys):
    """``ulimit -f 40``: safetensors' SafetensorError (no OSError) was a traceback, and an empty --out was left."""
    out = tmp_path / "out"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (40 * 1024, hard))  # Python ignores SIGXFSZ: writes fail EFBIG
    try:
        code = main(_argv(command, source, out))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 1
    assert f"error: [Errno 27] File too large: '{out / weights}'" in _one_line(capsys)
    assert _left_in(tmp_path) == ["source"]


def test_written_files_and_directories_are_readable_by_all(source, tmp_path):
    """The weights were 0600 (the safetensors writer's temporary file) beside 0644 text files."""
    assert main(_argv("import-hf", source, tmp_path / "imported")) == 0
    assert main(_argv("export-hf", tmp_path / "imported", tmp_path / "exported")) == 0
    for directory in (source, tmp_path / "imported", tmp_path / "exported"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755
        modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in directory.iterdir()}
        assert set(modes.values()) == {0o644}, modes


def _gguf(path: Path, experts: int = 0, sizes: bool = False) -> bytes:
    """A GGUF file holding one tensor (and ``llama.expert_count`` when ``experts``; with ``sizes``, every size a
    dense llama's config needs but the vocabulary's); its bytes."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    if experts:
        writer.add_expert_count(experts)
    if sizes:
        writer.add_head_count(4)
        writer.add_embedding_length(16)
        writer.add_feed_forward_length(32)
        writer.add_context_length(64)
        writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tensor("token_embd.weight", np.ones((64, 16), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.mark.parametrize(("content", "reason"), [
    (lambda path: np.random.default_rng(0).bytes(3000), "(GGUF magic invalid)"),
    (lambda path: _gguf(path)[:-100], "(the file ends inside a field that starts at byte 160)"),  # the tensor's data
], ids=["garbled", "truncated"])
def test_a_garbled_or_truncated_gguf_is_named_in_one_line(content, reason, tmp_path, capsys):
    """The gguf package's ValueError passed as it was: "error: GGUF magic invalid", naming no file."""
    path = tmp_path / "model.gguf"
    path.write_bytes(content(path))
    assert main(_argv("import-hf", path, tmp_path / "out")) == 2
    assert f"error: {path}: not a readable GGUF file {reason}" in _one_line(capsys)
    assert _left_in(tmp_path) == ["model.gguf"]


def test_a_mixture_of_experts_gguf_is_refused_naming_its_expert_count(tmp_path, capsys):
    """Mixtral's GGUF files are of the llama architecture with llama.expert_count set: the import refused them for a
    missing tensor (model.layers.0.mlp.gate_proj.weight), or the first missing field, not for what they are."""
    path = tmp_path / "mixtral.gguf"
    _gguf(path, experts=8)
    assert main(_argv("import-hf", path, tmp_path / "out")) == 2
    assert (f"error: {path}: GGUF metadata llama.expert_count=8 is not supported (dense feed-forward layers only)\n"
            in _one_line(capsys))
    assert _left_in(tmp_path) == ["mixtral.gguf"]


def test_a_gguf_without_a_vocabulary_is_refused_naming_the_fields_that_give_its_size(tmp_path, capsys):
    """Neither llama.vocab_size nor tokenizer.ggml.tokens: refused as 'model.vocab_size must be a positive integer,
    got 0', naming neither the file nor a GGUF field."""
    path = tmp_path / "no-vocabulary.gguf"
    _gguf(path, sizes=True)
    assert main(_argv("import-hf", path, tmp_path / "out")) == 2
    assert (f"error: {path}: GGUF metadata gives no vocabulary size (neither llama.vocab_size nor "
            "tokenizer.ggml.tokens)\n" in _one_line(capsys))
    assert _left_in(tmp_path) == ["no-vocabulary.gguf"]


def test_saving_over_a_directory_that_holds_files_is_refused_before_any_work(source, tmp_path, monkeypatch):
    """``hf.save`` writes a new directory whole: over one holding anything (a user's notes, an earlier export) it
    refuses at once, before converting a tensor, and leaves it as it was; an empty directory is filled."""
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.md").write_text("mine")
    converted = []
    monkeypatch.setattr(convert, "hf_tensors", lambda *args: converted.append(args) or {})
    with pytest.raises(FileExistsError, match=r"exists and is not an empty directory: '.*kept'"):
        hf.save(LLAMA, init_params(LLAMA, 0)[1], tmp_path / "kept")
    assert converted == [] and _left_in(tmp_path / "kept") == ["notes.md"]
    with pytest.raises(FileExistsError):
        hf.save(LLAMA, init_params(LLAMA, 0)[1], source)  # a second save to the same place
    monkeypatch.undo()
    (tmp_path / "empty").mkdir()
    hf.save(LLAMA, init_params(LLAMA, 0)[1], tmp_path / "empty")
    assert _left_in(tmp_path / "empty") == ["config.json", "model.safetensors"]


def _index(directory: Path, weights: Path, shard: str) -> None:
    """``directory/model.safetensors.index.json``, naming ``shard`` as the file of every tensor of ``weights``."""
    import json

    names = list(convert.read_safetensors(weights))
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: shard for name in sorted(names)}}))


def _sharded(directory: Path, source: Path, weights: Path, shard: str) -> None:
    """``directory``: ``source``'s config.json, and an index naming ``shard`` as the file of every tensor of
    ``weights`` (``source``'s model.safetensors, moved)."""
    directory.mkdir()
    (directory / "config.json").write_bytes((source / "config.json").read_bytes())
    _index(directory, weights, shard)


@pytest.mark.parametrize("shard", ["../secret/model.safetensors", "{tmp}/secret/model.safetensors"],
                         ids=["climbs-out", "absolute"])
def test_a_shard_index_naming_a_file_outside_the_checkpoint_is_refused(shard, source, tmp_path, capsys):
    """The index's weight_map named ../secret/model.safetensors (or an absolute path) and import-hf read it, where
    transformers refuses it: a shard must be inside the checkpoint directory."""
    (tmp_path / "secret").mkdir()
    (source / "model.safetensors").rename(tmp_path / "secret" / "model.safetensors")
    shard = shard.replace("{tmp}", str(tmp_path))
    _sharded(tmp_path / "ckpt", source, tmp_path / "secret" / "model.safetensors", shard)
    assert main(_argv("import-hf", tmp_path / "ckpt", tmp_path / "out")) == 2
    index = tmp_path / "ckpt" / "model.safetensors.index.json"
    assert (f"error: {index}: weight_map['lm_head.weight']={shard!r} is not a file inside "
            f"{tmp_path / 'ckpt'}\n") in _one_line(capsys)
    assert not (tmp_path / "out").exists()


def test_a_shard_index_whose_weight_map_is_no_object_is_named_in_one_short_line(source, tmp_path, capsys):
    import json

    (source / "model.safetensors").unlink()
    (source / "model.safetensors.index.json").write_text(json.dumps({"weight_map": list(range(100_000))}))
    assert main(_argv("import-hf", source, tmp_path / "out")) == 2
    line = _one_line(capsys)
    assert "model.safetensors.index.json: weight_map=[0, 1, 2, 3, 4, 5, ...] is not an object" in line
    assert len(line) < 400 and not (tmp_path / "out").exists()


def test_shards_linked_to_blobs_outside_the_directory_are_read_as_in_the_hubs_cache(source, tmp_path):
    """The Hub's cache keeps a snapshot's shards as links to ../../blobs: names inside the directory, read as
    transformers reads them (it checks the names, not where links lead)."""
    (tmp_path / "blobs").mkdir()
    (source / "model.safetensors").rename(tmp_path / "blobs" / "0123abcd")
    _sharded(tmp_path / "snapshots", source, tmp_path / "blobs" / "0123abcd", "shards/model-00001-of-00001.safetensors")
    (tmp_path / "snapshots" / "shards").mkdir()
    (tmp_path / "snapshots" / "shards" / "model-00001-of-00001.safetensors").symlink_to("../../blobs/0123abcd")
    ours = convert.flat_params(hf.load(tmp_path / "snapshots")[1])
    expected = convert.flat_params(init_params(LLAMA, 0)[1])
    assert ours.keys() == expected.keys() and all(np.array_equal(ours[k], expected[k]) for k in ours)


def test_model_safetensors_is_read_before_a_shard_index_beside_it_as_transformers_reads_it(source, tmp_path):
    """transformers' save_pretrained of a model, unsharded, into the directory of its sharded save keeps the old
    index: transformers reads model.safetensors, the import read the index (the old weights where its shards stayed,
    else a missing shard's FileNotFoundError)."""
    import transformers

    old = hf.save(LLAMA, init_params(LLAMA, 1)[1], tmp_path / "old") / "model.safetensors"
    old.rename(source / "model-00001-of-00001.safetensors")
    _index(source, source / "model-00001-of-00001.safetensors", "model-00001-of-00001.safetensors")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(source).model.embed_tokens.weight.detach().numpy()
    ours = convert.flat_params(hf.load(source)[1])["embedding.tokens"]
    assert np.array_equal(ours, theirs)
    assert np.array_equal(ours, convert.flat_params(init_params(LLAMA, 0)[1])["embedding.tokens"])  # the new ones
