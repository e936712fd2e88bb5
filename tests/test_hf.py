"""Hugging Face checkpoints in and out (#19), verified against ``transformers`` (a test peer, like PyTorch SDPA).

Every family is a small random-weight ``transformers`` model built from its config (nothing is
downloaded), saved, imported with `jaxformer.hf.load`, and compared with ``transformers`` itself:
logits of a right-padded batch (≤ 1e-4 in float32), KV-cache greedy decoding token for token, and
export back to a directory ``transformers`` loads, with every tensor and parameter bit-identical.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
import yaml
from flax import nnx
from hf_helpers import (CHAT_TEMPLATE, VOCAB, assert_refused_in_one_line, attention_mask, hf_model, tiny_gguf,
                        tokens)
from safetensors.numpy import load_file

import jaxformer
from jaxformer import hf
from jaxformer.accounting import count_params
from jaxformer.cli import main
from jaxformer.hf.convert import flat_params
from jaxformer.models import ModelConfig, apply, build_model, init_params

TOLERANCE = 1e-4
LENGTHS = [12, 7]


def _import(name: str, tmp_path):
    model = hf_model(name)
    model.save_pretrained(tmp_path / name)
    cfg, params = hf.load(tmp_path / name)
    return model, cfg, params


def _ours(cfg, params, *inputs, **kwargs) -> np.ndarray:
    return np.asarray(apply(init_params(cfg, 0)[0], params, *inputs, **kwargs)[0])


def _theirs_and_ours(name: str, model, cfg, params) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Outputs of both on a right-padded batch, each sequence cut to its real positions."""
    ids = tokens(2, 12)
    mask = attention_mask(LENGTHS, 12)
    lengths = jnp.asarray(LENGTHS)
    with torch.no_grad():
        if cfg.family == "encoder_decoder":
            target = tokens(2, 9, seed=1)
            target_lengths = [9, 4]
            out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                        decoder_input_ids=torch.tensor(target),
                        decoder_attention_mask=torch.tensor(attention_mask(target_lengths, 9))).logits.numpy()
            ours = _ours(cfg, params, jnp.asarray(ids), jnp.asarray(target), source_lengths=lengths,
                         target_lengths=jnp.asarray(target_lengths))
            return ([out[b, :n] for b, n in enumerate(target_lengths)],
                    [ours[b, :n] for b, n in enumerate(target_lengths)])
        kwargs = {}
        if cfg.family == "encoder":
            types = np.random.default_rng(2).integers(0, cfg.num_token_types, ids.shape)
            kwargs["token_types"] = jnp.asarray(types)
            result = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                           token_type_ids=torch.tensor(types))
            out = result.logits.numpy() if cfg.mlm_head else result.last_hidden_state.numpy()
        else:
            out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    ours = _ours(cfg, params, jnp.asarray(ids), lengths=lengths, **kwargs)
    return [out[b, :n] for b, n in enumerate(LENGTHS)], [ours[b, :n] for b, n in enumerate(LENGTHS)]


FAMILIES = ["gpt2", "gpt2-exact-gelu", "llama", "llama-bias-tied", "mistral", "qwen2", "bert", "bert-base-model",
            "marian", "t5", "t5-v1_1"]


@pytest.mark.parametrize("name", FAMILIES)
def test_imported_logits_match_transformers_and_the_round_trip_is_bit_identical(name, tmp_path):
    model, cfg, params = _import(name, tmp_path)
    # every learned number of the checkpoint (Marian's logit bias is a buffer; its sinusoid tables are frozen)
    learned = sum(p.numel() for p in model.parameters() if p.requires_grad)
    learned += model.final_logits_bias.numel() if hasattr(model, "final_logits_bias") else 0
    assert sum(p.size for p in jax_leaves(params)) == count_params(cfg).total == learned
    theirs, ours = _theirs_and_ours(name, model, cfg, params)
    scale = max(np.abs(t).max() for t in theirs)
    assert scale > 1.0  # random weights large enough that the comparison means something
    assert max(np.abs(t - o).max() for t, o in zip(theirs, ours)) <= TOLERANCE

    # out: a directory transformers loads, holding exactly the tensors it saved
    hf.save(cfg, params, tmp_path / "out")
    original = load_file(tmp_path / name / "model.safetensors")
    exported = load_file(tmp_path / "out" / "model.safetensors")
    assert exported.keys() <= original.keys()
    for key, value in exported.items():
        assert np.array_equal(value.reshape(original[key].shape), original[key]), key
    auto = getattr(transformers, hf.families.auto_class(cfg))
    reloaded = auto.from_pretrained(tmp_path / "out").eval()
    assert type(reloaded) is type(model)
    again, _ = _theirs_and_ours(name, reloaded, cfg, params)
    assert all(np.array_equal(a, t) for a, t in zip(again, theirs))  # the very same weights

    # in again: bit-identical parameters
    cfg2, params2 = hf.load(tmp_path / "out")
    assert cfg2 == cfg
    first, second = flat_params(params), flat_params(params2)
    assert first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)


def jax_leaves(params):
    import jax

    return jax.tree.leaves(params)


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral", "marian", "t5"])
def test_kv_cache_greedy_decoding_matches_transformers_generate(name, tmp_path):
    """Mistral's window (5) is shorter than prompt + new tokens, so jaxformer's ring cache wraps."""
    model, cfg, params = _import(name, tmp_path)
    prompt = tokens(1, 6, seed=3)
    model.generation_config.eos_token_id = None  # decode all the tokens asked for
    model.generation_config.forced_eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor(prompt), attention_mask=torch.ones_like(torch.tensor(prompt)),
                             max_new_tokens=10, do_sample=False, pad_token_id=0)
    theirs = out[0, 1:] if cfg.family == "encoder_decoder" else out[0, prompt.shape[1]:]
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: build_model(cfg, rngs=nnx.Rngs(0))))
    start = getattr(model.config, "decoder_start_token_id", None) or 0
    ours = jaxformer.generate(nnx.merge(graphdef, params), prompt[0], max_new_tokens=10, temperature=0.0,
                              start_token=start)
    assert [int(t) for t in ours] == theirs.tolist()


def test_pytorch_bin_sharded_and_bfloat16_checkpoints_read_as_the_same_parameters(tmp_path):
    import shutil

    model = hf_model("llama")
    model.save_pretrained(tmp_path / "single")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    (tmp_path / "bin").mkdir()
    shutil.copy(tmp_path / "single" / "config.json", tmp_path / "bin")
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    reference = flat_params(hf.load(tmp_path / "single")[1])
    for kind in ("sharded", "bin"):
        other = flat_params(hf.load(tmp_path / kind)[1])
        assert other.keys() == reference.keys() and all(np.array_equal(other[k], reference[k]) for k in other), kind
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    halved = flat_params(hf.load(tmp_path / "bf16")[1])
    rounded = {k: np.asarray(jnp.asarray(v, jnp.bfloat16), np.float32) for k, v in reference.items()}
    assert all(np.array_equal(halved[k], rounded[k]) for k in reference)  # bf16 values, exactly, in float32


class _RunsACommand:
    """A pickle that runs a shell command when unpickled without weights_only (what a hostile .bin holds)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_pytorch_bin_that_would_run_code_is_refused_in_one_line_and_not_run(tmp_path, capsys):
    import pickle
    import shutil

    hf_model("llama").save_pretrained(tmp_path / "good")
    (tmp_path / "hostile").mkdir()
    shutil.copy(tmp_path / "good" / "config.json", tmp_path / "hostile")
    marker = tmp_path / "ran"
    with open(tmp_path / "hostile" / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"model.embed_tokens.weight": _RunsACommand(marker)}, handle)
    assert_refused_in_one_line(tmp_path / "hostile", tmp_path / "imported",
                               f"{tmp_path / 'hostile' / 'pytorch_model.bin'}: refused by PyTorch's weights-only "
                               "loader, nothing in it was run (", capsys)
    assert not marker.exists()
    # torch.save's zip format: the reason, not torch's advice to load it with weights_only=False (which runs it)
    torch.save({"model.embed_tokens.weight": _RunsACommand(marker)}, tmp_path / "hostile" / "pytorch_model.bin")
    assert_refused_in_one_line(tmp_path / "hostile", tmp_path / "imported",
                               f"{tmp_path / 'hostile' / 'pytorch_model.bin'}: refused by PyTorch's weights-only "
                               "loader, nothing in it was run (Trying to load unsupported GLOBAL posix.system", capsys)
    assert not marker.exists()


@pytest.mark.parametrize(("add_bos", "add_eos"), [(None, None), (True, None), (False, None), (True, True)])
def test_a_gguf_tokenizer_adds_bos_and_eos_as_transformers_does(add_bos, add_eos, tmp_path):
    """``tokenizer.ggml.add_bos_token`` (Llama 3's GGUFs) was ignored, so every prompt lost its BOS."""
    from tokenizers import Tokenizer

    tiny_gguf(tmp_path / "tiny.gguf", add_bos=add_bos, add_eos=add_eos)
    ours = Tokenizer.from_str(hf.read_checkpoint(tmp_path / "tiny.gguf").tokenizer_json)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tiny.gguf")
    for text in ("hello world", "w"):
        assert ours.encode(text).ids == theirs(text).input_ids, text
    assert ours.encode("hello").ids[0] == (0 if add_bos else ord("h") - ord("!") + 2)


def test_a_gguf_with_linear_rope_scaling_imports_as_position_interpolation_and_another_kind_is_refused(tmp_path):
    """``llama.rope.scaling.type: linear`` with ``factor`` f: positions divided by f (llama.cpp's ``freq_scale`` 1/f,
    transformers' linear ``rope_scaling``), the ``rope_scale`` a config with that ``rope_scaling`` imports to; yarn is
    refused naming the key."""
    for name, scaling in (("plain", None), ("linear", ("linear", 4.0)), ("yarn", ("yarn", 4.0))):
        tiny_gguf(tmp_path / f"{name}.gguf", rope_scaling=scaling)
    assert hf.read_checkpoint(tmp_path / "plain.gguf").cfg.rope_scale == 1.0
    assert hf.read_checkpoint(tmp_path / "linear.gguf").cfg.rope_scale == 0.25
    with pytest.raises(ValueError, match=r"yarn.gguf: GGUF metadata llama.rope.scaling.type='yarn' is not supported "
                                         r"\(none, linear\)"):
        hf.read_checkpoint(tmp_path / "yarn.gguf")


def test_special_tokens_and_the_chat_template_survive_import_and_export(tmp_path, capsys):
    """import-hf then export-hf kept tokenizer.json alone: the exported tokenizer had no BOS, EOS or chat template
    (apply_chat_template failed). From a GGUF and from a Hugging Face directory, the exported tokenizer now equals
    the source's as transformers loads it."""
    tiny_gguf(tmp_path / "tiny.gguf", add_bos=True, chat_template=CHAT_TEMPLATE)
    from_gguf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tiny.gguf")
    hf_model("llama").save_pretrained(tmp_path / "dir")
    from_gguf.save_pretrained(tmp_path / "dir")  # tokenizer.json, tokenizer_config.json, chat_template.jinja
    from_dir = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "dir"))
    messages = [{"role": "user", "content": "hello w"}]
    for source, reference in ((tmp_path / "tiny.gguf", from_gguf), (tmp_path / "dir", from_dir)):
        imported, exported = tmp_path / f"{source.stem}-imported", tmp_path / f"{source.stem}-exported"
        assert main(["import-hf", str(source), "--out", str(imported)]) == 0
        assert main(["export-hf", str(imported), "--out", str(exported)]) == 0
        again = transformers.AutoTokenizer.from_pretrained(str(exported))
        for name in ("bos_token", "eos_token", "pad_token", "unk_token", "chat_template"):
            assert getattr(again, name) == getattr(reference, name), (source.name, name)
        assert reference.bos_token == "<|begin_of_text|>" and reference.chat_template == CHAT_TEMPLATE
        assert again.apply_chat_template(messages, tokenize=True) == reference.apply_chat_template(messages, tokenize=True)
        assert again("hello w").input_ids == reference("hello w").input_ids
    capsys.readouterr()


def test_rope_permutation_is_exact_and_its_own_inverse():
    from jaxformer.hf.layout import halves_to_pairs, pairs_to_halves

    x = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8)
    pairs = halves_to_pairs(x)
    assert pairs[0, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]  # ours[2i] = theirs[i], ours[2i+1] = theirs[i + D/2]
    assert np.array_equal(pairs_to_halves(pairs), x)


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "mamba"}, "config.json: model_type='mamba' is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "config.json: rope_scaling.rope_type='yarn' is not supported"),
    ({"hidden_act": "gelu"}, "config.json: hidden_act='gelu' is not supported"),
    ({"mlp_bias": True}, "config.json: mlp_bias=True is not supported"),
])
def test_unsupported_checkpoints_fail_in_one_line_naming_the_field(change, message, tmp_path, capsys):
    hf_model("llama").save_pretrained(tmp_path / "src")
    config = json.loads((tmp_path / "src" / "config.json").read_text())
    config.pop("rope_parameters", None)
    (tmp_path / "src" / "config.json").write_text(json.dumps({**config, **change}))
    assert_refused_in_one_line(tmp_path / "src", tmp_path / "imported", message, capsys)


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(position="alibi"), "model.position='alibi'"),
    (dict(num_experts=4, position="rope", activation="swiglu", norm="rmsnorm"), "model.num_experts=4"),
    (dict(position="rope", activation="gelu", norm="rmsnorm"), "model.activation='gelu' has no Hugging Face Llama"),
    (dict(norm_position="sandwich"), "model.norm_position='sandwich'"),
    # options that change the logits and that no exported family's config can say (they were exported silently)
    (dict(attention_scale=0.5), "model.attention_scale=0.5 has no Hugging Face GPT-2"),
    (dict(scale_head_inputs=True), "model.scale_head_inputs=True has no Hugging Face GPT-2"),
    (dict(position="rope", activation="swiglu", norm="rmsnorm", attention_scale=0.5),
     "model.attention_scale=0.5 has no Hugging Face Llama"),
    (dict(position="rope", activation="swiglu", norm="rmsnorm", scale_head_inputs=True),
     "model.scale_head_inputs=True has no Hugging Face Llama"),
    (dict(family="encoder", norm_position="post", embedding_norm=True, num_token_types=2, attention_scale=0.5),
     "model.attention_scale=0.5 has no Hugging Face BERT"),
    *[(dict(family="encoder_decoder", num_encoder_layers=1, position="sinusoidal", sinusoidal_layout="split",
            activation="silu", norm_position="post", logit_bias=True, **option), f"model.{shown} has no Hugging Face Marian")
      for option, shown in ((dict(attention_scale=0.5), "attention_scale=0.5"),
                            (dict(scale_head_inputs=True), "scale_head_inputs=True"),
                            (dict(sliding_window=3), "sliding_window=3"))],
])
def test_models_without_a_hugging_face_equivalent_are_refused_naming_the_field(overrides, message, tmp_path):
    cfg = ModelConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=1, max_seq_len=16, **overrides)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        hf.save(cfg, nnx.eval_shape(lambda: init_params(cfg, 0))[1], tmp_path / "out")  # refused before reading
    assert not (tmp_path / "out").exists()


def test_cli_import_generate_export_with_the_checkpoints_tokenizer(tmp_path, capsys):
    """import-hf → generate --hf (the checkpoint's tokenizer.json) → export-hf → transformers, same logits."""
    from jaxformer.hf.tokenizer import byte_tokenizer_json
    from tokenizers import Tokenizer

    model = hf_model("llama")
    model.save_pretrained(tmp_path / "src")
    (tmp_path / "src" / "tokenizer.json").write_text(_small_tokenizer_json())
    assert main(["import-hf", str(tmp_path / "src"), "--out", str(tmp_path / "imported")]) == 0
    assert "imported llama (decoder, 2 layers, d_model 32)" in capsys.readouterr().out
    model_yaml = yaml.safe_load((tmp_path / "imported" / "model.yaml").read_text())["model"]
    assert model_yaml["rope_scaling"] == "llama3" and model_yaml["num_kv_heads"] == 2
    assert main(["count", str(tmp_path / "imported" / "model.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == sum(p.numel() for p in model.parameters())

    tokenizer = Tokenizer.from_file(str(tmp_path / "src" / "tokenizer.json"))
    prompt = "abc ab"
    ids = tokenizer.encode(prompt).ids
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  max_new_tokens=6, do_sample=False, pad_token_id=0)[0, len(ids):]
    for source in ("src", "imported"):
        argv = ["generate", "--hf", str(tmp_path / source), "--prompt", prompt, "--max-new-tokens", "6",
                "--temperature", "0"]
        assert main(argv) == 0
        assert capsys.readouterr().out == prompt + tokenizer.decode(expected.tolist(), skip_special_tokens=False) + "\n"

    assert main(["export-hf", str(tmp_path / "imported"), "--out", str(tmp_path / "exported")]) == 0
    assert "AutoModelForCausalLM" in capsys.readouterr().out
    assert (tmp_path / "exported" / "tokenizer.json").read_text() == (tmp_path / "src" / "tokenizer.json").read_text()
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    x = torch.tensor(tokens(1, 9))
    with torch.no_grad():
        assert torch.equal(reloaded(x).logits, model(x).logits)
    assert main(["export-hf", str(tmp_path / "imported"), "--out", str(tmp_path / "exported")]) == 2  # not empty
    assert "exists and is not empty" in capsys.readouterr().err
    assert json.loads(byte_tokenizer_json())["model"]["vocab"]["a"] == ord("a")


def _small_tokenizer_json() -> str:
    """A byte-level BPE over the random models' vocabulary: the 256-byte alphabet cut to VOCAB symbols."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    symbols = [chr(c) for c in range(ord("a"), ord("a") + VOCAB - 2)] + ["Ġ", "Ġa"]
    vocab = {s: i for i, s in enumerate(symbols)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "a")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer.to_str()


def test_training_starts_from_an_imported_checkpoint_and_exports_to_transformers(tmp_path, capsys):
    """``model.init_from``: the run trains the checkpoint's architecture from its weights, on text encoded
    with the checkpoint's tokenizer.json (``data.tokenizer=bpe``); export-hf of the run loads in transformers,
    with the checkpoint's special token ids and chat template, and the run's samples stop at its EOS."""
    from tokenizers import Tokenizer

    model = hf_model("llama-bias-tied")
    tokenizer = Tokenizer.from_str(_small_tokenizer_json())
    prompt = tokenizer.encode("hello").ids
    with torch.no_grad():  # the source's EOS: a token its greedy continuation makes, not earlier (here the third)
        continuation = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                      max_new_tokens=6, do_sample=False, eos_token_id=None)[0, len(prompt):].tolist()
    stop = next(k for k in range(1, 6) if continuation[k] not in continuation[:k])
    model.config.eos_token_id = model.generation_config.eos_token_id = continuation[stop]
    model.generation_config.repetition_penalty = 1.05  # generation_config.json's own: kept for the export too
    model.save_pretrained(tmp_path / "src")
    (tmp_path / "src" / "tokenizer.json").write_text(_small_tokenizer_json())
    (tmp_path / "src" / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    corpus = tmp_path / "text.txt"
    corpus.write_text("hello jaxformer " * 800)
    run = {"model": {"init_from": str(tmp_path / "src")},
           "data": {"corpus": f"files:{corpus}", "tokenizer": "bpe", "bpe_vocab_size": 257, "val_fraction": 0.001,
                    "doc_bytes": 512},
           "train": {"tokens": 512, "batch_size": 4, "seq_len": 32, "eval_tokens": 128},
           "optimizer": {"lr": 1e-9, "weight_decay": 0.0}, "logging": {"tensorboard": False}}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(run))
    run_dir = tmp_path / "run"
    assert main(["train", str(tmp_path / "train.yaml"), "logging.progress=none", "--run-dir", str(run_dir)]) == 0
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]
    assert saved["init_from"] == str(tmp_path / "src") and saved["use_bias"] is True
    assert saved["rope_scale"] == 0.5 and saved["tie_embeddings"] is True and saved["vocab_size"] == VOCAB
    assert (run_dir / "tokenizer.json").read_text() == (tmp_path / "src" / "tokenizer.json").read_text()
    capsys.readouterr()
    assert main(["generate", str(run_dir), "--prompt", "hello", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == "hello" + tokenizer.decode(continuation[:stop]) + "\n"
    assert main(["export-hf", str(run_dir), "--out", str(tmp_path / "exported")]) == 0
    exported = tmp_path / "exported"
    assert json.loads((exported / "config.json").read_text())["eos_token_id"] == continuation[stop]
    assert json.loads((exported / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    assert transformers.GenerationConfig.from_pretrained(exported).repetition_penalty == 1.05
    trained = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    # a learning rate of 1e-9 for 4 steps leaves the imported weights (a fresh N(0, 0.02²) init would not)
    for (name, before), after in zip(model.state_dict().items(), trained.state_dict().values()):
        assert torch.allclose(before, after, atol=1e-6), name
    ids = Tokenizer.from_file(str(tmp_path / "exported" / "tokenizer.json")).encode("hello jax").ids
    with torch.no_grad():
        theirs = trained(torch.tensor([ids])).logits.numpy()[0]
    from jaxformer.train.restore import load_run_config, restore_params

    _, params = restore_params(run_dir)
    cfg = load_run_config(run_dir).model
    assert np.abs(_ours(cfg, params, jnp.asarray([ids]))[0] - theirs).max() <= TOLERANCE


def test_runs_saved_before_the_new_model_options_still_resume():
    """A saved config.yaml without the fields added since (qkv_bias, rope_scaling, …, init_from) reads them
    at their defaults, so resuming it is no conflict; a changed new field still is."""
    from jaxformer.train.config import config_to_dict, load_config, resume_conflict

    current = load_config(None)
    saved = config_to_dict(current)
    for name in ("qkv_bias", "rope_scaling", "rope_scaling_factor", "sinusoidal_layout", "embedding_norm",
                 "num_token_types", "scale_embeddings", "logit_bias", "mlm_head", "pooler", "init_from",
                 "relative_attention_num_buckets", "relative_attention_max_distance", "attention_scale",
                 "scale_head_inputs"):
        del saved["model"][name]
    assert resume_conflict(saved, current) is None
    saved["model"]["logit_bias"] = True
    assert resume_conflict(saved, current) == "model.logit_bias was True in the saved run, now False"
