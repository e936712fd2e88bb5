"""Models built in jaxformer out to ``transformers`` (#19), beyond the imports of tests/test_hf.py: export of the
families and head options no import there reaches, with ``transformers`` as the peer (its logits within 1e-4 in
float32, its greedy generation token for token, the export read back bit for bit), and checkpoints with untied
heads, which transformers 5 reads with none of the ties its tied models have."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from hf_helpers import VOCAB, assert_refused_in_one_line, hf_model, tokens

import jaxformer
from jaxformer import hf
from jaxformer.hf.convert import flat_params, params_from_flat
from jaxformer.models import ModelConfig, apply, init_params

TOLERANCE = 1e-4
SIZES = dict(vocab_size=VOCAB, d_model=32, num_heads=4, num_layers=2, max_seq_len=32)
LLAMA = dict(SIZES, position="rope", activation="swiglu", norm="rmsnorm", use_bias=False)
BERT = dict(SIZES, family="encoder", norm_position="post", embedding_norm=True, num_token_types=2)
MARIAN = dict(SIZES, family="encoder_decoder", num_encoder_layers=1, position="sinusoidal", sinusoidal_layout="split",
              norm_position="post", activation="silu", logit_bias=True)
CASES = {
    "gpt2-untied": dict(SIZES, tie_embeddings=False, activation="relu"),
    "llama-gqa-untied-llama3": dict(LLAMA, num_kv_heads=2, tie_embeddings=False, rope_base=5e5, rope_scaling="llama3",
                                    rope_original_max_seq_len=8),
    "mistral-linear": dict(LLAMA, sliding_window=4, num_kv_heads=1, head_dim=16, rope_scale=0.25),
    "qwen2-untied": dict(LLAMA, qkv_bias=True, num_kv_heads=2, tie_embeddings=False),
    # untied: transformers read the export's MLM head with a random decoder.bias, and Marian's stacks with random
    # embed_tokens (logits off by 0.46 and 0.43)
    "bert-untied": dict(BERT, tie_embeddings=False, pooler=True),
    "marian-untied": dict(MARIAN, tie_embeddings=False, scale_embeddings=True),
    # no final_logits_bias written (transformers zeros the buffer): read back as no logit bias, not as zeros
    "marian-no-logit-bias": dict(MARIAN, logit_bias=False),
}


def _random_params(cfg: ModelConfig) -> nnx.State:
    """Parameters ~ init + N(0, 0.2²): every bias and norm shift non-zero, so each one moves the logits."""
    rng = np.random.default_rng(0)
    flat = {name: (value + 0.2 * rng.standard_normal(value.shape)).astype(np.float32)
            for name, value in flat_params(init_params(cfg, 0)[1]).items()}
    return params_from_flat(cfg, flat, source="random")


def _logits(model, cfg: ModelConfig, params, ids: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(transformers', jaxformer's)`` logits (an encoder's: the masked-LM head's, on token types 0 and 1)."""
    graphdef = init_params(cfg, 0)[0]
    with torch.no_grad():
        if cfg.family == "encoder_decoder":
            theirs = model(input_ids=torch.tensor(ids), decoder_input_ids=torch.tensor(target)).logits
            return theirs.numpy(), np.asarray(apply(graphdef, params, jnp.asarray(ids), jnp.asarray(target))[0])
        if cfg.family == "encoder":
            types = np.arange(ids.size).reshape(ids.shape) % 2
            theirs = model(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types)).logits
            return theirs.numpy(), np.asarray(apply(graphdef, params, jnp.asarray(ids),
                                                    token_types=jnp.asarray(types))[0])
        return model(input_ids=torch.tensor(ids)).logits.numpy(), np.asarray(apply(graphdef, params,
                                                                                   jnp.asarray(ids))[0])


@pytest.mark.parametrize("name", list(CASES))
def test_a_jaxformer_model_exports_with_the_same_logits_and_greedy_generation(name, tmp_path):
    cfg = ModelConfig(**CASES[name])
    params = _random_params(cfg)
    hf.save(cfg, params, tmp_path / "out")
    model = getattr(transformers, hf.families.auto_class(cfg)).from_pretrained(tmp_path / "out").eval()
    ids, target = tokens(2, 10), tokens(2, 7, seed=1)
    theirs, ours = _logits(model, cfg, params, ids, target)
    assert np.abs(theirs).max() > 1.0 and np.abs(theirs - ours).max() <= TOLERANCE
    # no special tokens, as jaxformer's own model has none: not the class's defaults (GPT-2's 50256, out of the
    # vocabulary; Llama's 2, at which transformers' generation would stop and jaxformer's not)
    assert (model.config.bos_token_id, model.config.eos_token_id) == (None, None)

    if cfg.family != "encoder":
        prompt = ids[0, :5]
        with torch.no_grad():
            out = model.generate(torch.tensor(prompt[None]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                                 max_new_tokens=8, do_sample=False)
        expected = out[0, 1:] if cfg.family == "encoder_decoder" else out[0, 5:]
        start = getattr(model.config, "decoder_start_token_id", None) or 0
        generated = jaxformer.generate(nnx.merge(init_params(cfg, 0)[0], params), prompt, max_new_tokens=8,
                                       temperature=0.0, start_token=start)
        assert [int(t) for t in generated] == expected.tolist()

    cfg2, params2 = hf.load(tmp_path / "out")
    first, second = flat_params(params), flat_params(params2)
    assert cfg2 == cfg and first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)


def test_an_untied_bert_head_is_imported_with_the_bias_transformers_adds(tmp_path):
    """transformers 5 unties cls.predictions.decoder.bias from cls.predictions.bias with the head; the import read
    cls.predictions.bias, which that model never adds."""
    model = hf_model("bert-untied")
    head = model.cls.predictions
    assert head.decoder.bias is not head.bias and not torch.equal(head.decoder.bias, head.bias)
    model.save_pretrained(tmp_path / "src")
    cfg, params = hf.load(tmp_path / "src")
    theirs, ours = _logits(model, cfg, params, tokens(2, 10), None)
    assert np.abs(theirs - ours).max() <= TOLERANCE


def test_an_untied_marian_is_imported_from_the_embeddings_its_stacks_use(tmp_path, capsys):
    """transformers 5 unties each stack's embed_tokens from model.shared with the head; the import read shared.
    Stacks that embed alike import with the same logits; stacks that do not (jaxformer has one embedding) are
    refused in one line naming the tensor."""
    model = hf_model("marian-untied")
    model.save_pretrained(tmp_path / "differ")
    assert_refused_in_one_line(tmp_path / "differ", tmp_path / "imported",
                               "model.decoder.embed_tokens.weight differs from model.encoder.embed_tokens.weight",
                               capsys)
    with torch.no_grad():
        model.model.decoder.embed_tokens.weight.copy_(model.model.encoder.embed_tokens.weight)
    assert not torch.equal(model.model.shared.weight, model.model.encoder.embed_tokens.weight)  # unused by both
    model.save_pretrained(tmp_path / "src")
    cfg, params = hf.load(tmp_path / "src")
    theirs, ours = _logits(model, cfg, params, tokens(2, 10), tokens(2, 7, seed=1))
    assert np.abs(theirs - ours).max() <= TOLERANCE


@pytest.mark.parametrize(("name", "copy", "original"), [
    ("gpt2", "lm_head.weight", "transformer.wte.weight"), ("qwen2", "lm_head.weight", "model.embed_tokens.weight"),
    ("bert", "cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
], ids=["gpt2", "qwen2", "bert"])
def test_a_tied_checkpoint_holding_a_head_of_its_own_is_refused_naming_tie_word_embeddings(name, copy, original,
                                                                                           tmp_path, capsys):
    """tie_word_embeddings=true, and the file holds an lm_head.weight that is not the embedding: transformers 5
    unties them and computes with that head; the import tied them and left it unread (logits off by 18 and 21).
    A copy equal to the embedding (a tied model's pytorch_model.bin) imports tied; with tie_word_embeddings=false
    the head is read, with transformers' logits."""
    import json

    from safetensors.numpy import load_file, save_file

    hf_model(name).save_pretrained(tmp_path / "src")
    weights, config = tmp_path / "src" / "model.safetensors", tmp_path / "src" / "config.json"
    tensors = load_file(weights)
    save_file({**tensors, copy: tensors[original].copy()}, weights, metadata={"format": "pt"})
    assert hf.load(tmp_path / "src")[0].tie_embeddings
    head = np.random.default_rng(1).standard_normal(tensors[original].shape).astype(np.float32)
    save_file({**tensors, copy: head}, weights, metadata={"format": "pt"})
    theirs = transformers.AutoModelForMaskedLM if name == "bert" else transformers.AutoModelForCausalLM
    theirs = theirs.from_pretrained(tmp_path / "src").eval()
    assert np.array_equal(theirs.get_output_embeddings().weight.detach().numpy(), head)  # untied by transformers
    assert_refused_in_one_line(tmp_path / "src", tmp_path / "imported",
                               f"{tmp_path / 'src'}: config.json: tie_word_embeddings=True, but its {copy} differs "
                               f"from {original} (transformers 5 then unties them", capsys)
    config.write_text(json.dumps({**json.loads(config.read_text()), "tie_word_embeddings": False}))
    cfg, params = hf.load(tmp_path / "src")
    assert not cfg.tie_embeddings
    reference, ours = _logits(theirs, cfg, params, tokens(2, 10), None)
    assert np.abs(reference - ours).max() <= TOLERANCE


def test_the_generation_config_survives_import_and_export(tmp_path, capsys):
    """import-hf then export-hf dropped generation_config.json: transformers then generated from the export with
    config.json's one EOS and greedily, where the source stops at either of two EOS and samples (Qwen2.5's)."""
    from jaxformer.cli import main

    model = hf_model("qwen2")
    model.generation_config.update(eos_token_id=[5, 7], do_sample=True, temperature=0.7, top_p=0.8,
                                   repetition_penalty=1.05)
    model.config.eos_token_id = 5
    model.save_pretrained(tmp_path / "src")
    assert main(["import-hf", str(tmp_path / "src"), "--out", str(tmp_path / "imported")]) == 0
    assert main(["export-hf", str(tmp_path / "imported"), "--out", str(tmp_path / "exported")]) == 0
    capsys.readouterr()
    source = transformers.GenerationConfig.from_pretrained(tmp_path / "src")
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").generation_config
    assert exported.to_diff_dict() == source.to_diff_dict()
    assert (exported.eos_token_id, exported.do_sample, exported.top_p) == ([5, 7], True, 0.8)


def test_a_marian_without_a_logit_bias_keeps_none_through_import_and_export(tmp_path, capsys):
    """The export wrote final_logits_bias as zeros, and every import read it back as model.logit_bias=True: an
    export → import-hf → export-hf → load came back with a [V] parameter the model never had."""
    from safetensors import safe_open

    from jaxformer.cli import main

    cfg = ModelConfig(**dict(MARIAN, logit_bias=False))
    params = _random_params(cfg)
    hf.save(cfg, params, tmp_path / "out")
    with safe_open(tmp_path / "out" / "model.safetensors", "np") as written:
        assert "final_logits_bias" not in written.keys()
    model = transformers.MarianMTModel.from_pretrained(tmp_path / "out").eval()
    assert not model.final_logits_bias.any()  # transformers' zeros: the same logits (the CASES test)
    assert main(["import-hf", str(tmp_path / "out"), "--out", str(tmp_path / "imported")]) == 0
    assert main(["export-hf", str(tmp_path / "imported"), "--out", str(tmp_path / "exported")]) == 0
    capsys.readouterr()
    cfg2, params2 = hf.load(tmp_path / "exported")
    first, second = flat_params(params), flat_params(params2)
    assert not cfg2.logit_bias and cfg2 == cfg
    assert first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("kind", ["run", "import-hf"])
def test_export_refuses_a_model_without_equivalent_before_reading_its_parameters(kind, tmp_path, capsys):
    """export-hf restored a run's checkpoint (or read an import's params.safetensors) before it checked the model:
    a sandwich-norm model was refused only after the restore. Here the parameters are unreadable, so the refusal
    naming the field shows that nothing was read: before, the unreadable checkpoint was the error."""
    import yaml

    from jaxformer.cli import main
    from jaxformer.train.config import config_to_dict, load_config

    config = load_config(None, ["model.norm_position=sandwich", "model.d_model=32", "model.num_heads=2",
                                "model.num_layers=1"])
    source = tmp_path / kind
    if kind == "run":  # a step Orbax cannot read: restoring it raises CheckpointError
        (source / "checkpoints" / "5" / "state").mkdir(parents=True)
        (source / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    else:
        source.mkdir()
        (source / "params.safetensors").write_bytes(b"garbage")
        (source / "model.yaml").write_text(yaml.safe_dump({"model": config_to_dict(config)["model"]}))
    capsys.readouterr()
    assert main(["export-hf", str(source), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == ("jaxformer export-hf: error: model.norm_position='sandwich' has no Hugging Face Llama equivalent "
                   "(it needs model.norm_position='pre' or 'post')\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == [kind]


def test_export_reads_a_runs_config_once(tmp_path, capsys, monkeypatch):
    """export-hf read a run's config.yaml twice: to check the model before restoring, then to restore it."""
    import yaml

    from jaxformer.cli import main
    from jaxformer.train import restore
    from jaxformer.train.config import config_to_dict, load_config

    source = tmp_path / "run"
    (source / "checkpoints" / "5" / "state").mkdir(parents=True)  # unreadable: the restore fails once it is tried
    config = load_config(None, ["model.d_model=32", "model.num_heads=2", "model.num_layers=1"])
    (source / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    read, load = [], restore.load_run_config
    monkeypatch.setattr(restore, "load_run_config", lambda run_dir: read.append(run_dir) or load(run_dir))
    capsys.readouterr()
    assert main(["export-hf", str(source), "--out", str(tmp_path / "out")]) == 2
    assert "none of the checkpoints [5] in" in capsys.readouterr().err
    assert read == [source]
