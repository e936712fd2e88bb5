"""T5 in and out (#19), beyond the families' shared tests in tests/test_hf.py (logits of padded batches,
KV-cache greedy decoding, the bit-identical round trip, parameter counts): the relative position buckets
against ``transformers``' own, the command line, models trained in jaxformer, and what is refused."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
import yaml
from hf_helpers import VOCAB, assert_refused_in_one_line, attention_mask, hf_model, tokens
from transformers.models.t5.modeling_t5 import T5Attention

import jaxformer.functional as F
from jaxformer import hf
from jaxformer.cli import main
from jaxformer.hf.convert import flat_params
from jaxformer.hf.families import t5
from jaxformer.models import ModelConfig, apply, init_params

TOLERANCE = 1e-4


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (8, 6), (16, 20), (64, 1000), (6, 9)])
def test_relative_position_buckets_are_transformers_own(num_buckets, max_distance, bidirectional):
    """Every distance in ±1200, the exact bucket boundaries (16 and 32 of 128) included."""
    relative = torch.arange(-1200, 1201)  # transformers' key − query; ours is query − key
    theirs = T5Attention._relative_position_bucket(relative, bidirectional=bidirectional, num_buckets=num_buckets,
                                                   max_distance=max_distance).numpy()
    ours = F.relative_position_buckets(-relative.numpy(), num_buckets=num_buckets, max_distance=max_distance,
                                       bidirectional=bidirectional)
    assert np.array_equal(np.asarray(ours), theirs)


def test_relative_position_bias_is_the_table_at_each_distance_bucket():
    table_PH = jnp.arange(16.0).reshape(8, 2)
    bias_HTS = F.relative_position_bias(table_PH, 3, 5, offset=2, bidirectional=False, max_distance=6)
    buckets_TS = F.relative_position_buckets(np.arange(3)[:, None] + 2 - np.arange(5), num_buckets=8,
                                             max_distance=6, bidirectional=False)
    assert bias_HTS.shape == (2, 3, 5)
    assert np.array_equal(bias_HTS, np.moveaxis(np.asarray(table_PH)[np.asarray(buckets_TS)], -1, 0))
    # by default an encoder's (bidirectional) with T5's max_distance: transformers' own defaults, queries from 0
    relative = torch.arange(300)[None, :] - torch.arange(200)[:, None]  # key − query over 200 × 300
    theirs = T5Attention._relative_position_bucket(relative, num_buckets=32).numpy()
    table_PH = jnp.arange(64.0).reshape(32, 2)
    expected_HTS = np.moveaxis(np.asarray(table_PH)[theirs], -1, 0)
    assert np.array_equal(F.relative_position_bias(table_PH, 200, 300), expected_HTS)


def test_cli_import_count_export_and_transformers_loads_it(tmp_path, capsys):
    model = hf_model("t5")
    model.save_pretrained(tmp_path / "src")
    assert main(["import-hf", str(tmp_path / "src"), "--out", str(tmp_path / "imported")]) == 0
    assert "imported t5 (encoder_decoder, 2 layers, d_model 32)" in capsys.readouterr().out
    model_yaml = yaml.safe_load((tmp_path / "imported" / "model.yaml").read_text())["model"]
    assert (model_yaml["position"], model_yaml["attention_scale"], model_yaml["scale_head_inputs"]) == (
        "relative_bias", 1.0, True)
    assert main(["count", str(tmp_path / "imported" / "model.yaml"), "--json"]) == 0
    counted = json.loads(capsys.readouterr().out)
    assert counted["params"] == sum(p.numel() for p in model.parameters())  # the tied head counted once
    assert counted["params_breakdown"]["relative_bias"] == 2 * 8 * 4  # one [buckets, heads] table per stack

    assert main(["export-hf", str(tmp_path / "imported"), "--out", str(tmp_path / "exported")]) == 0
    assert "AutoModelForSeq2SeqLM" in capsys.readouterr().out
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "exported").eval()
    source, target = torch.tensor(tokens(2, 10)), torch.tensor(tokens(2, 7, seed=1))
    masks = dict(attention_mask=torch.tensor(attention_mask([10, 4], 10)),
                 decoder_attention_mask=torch.tensor(attention_mask([7, 3], 7)))
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=source, decoder_input_ids=target, **masks).logits,
                           model(input_ids=source, decoder_input_ids=target, **masks).logits)


@pytest.mark.parametrize("activation", ["geglu", "swiglu", "gelu"])
def test_a_jaxformer_t5_exports_with_the_same_logits(activation, tmp_path):
    """A model built in jaxformer (untied head, rescaled; a GELU gate written as gated-gelu_python, SwiGLU as
    gated-silu) loads into transformers with the same logits, and reads back bit for bit."""
    cfg = ModelConfig(family="encoder_decoder", vocab_size=VOCAB, d_model=24, num_layers=2, num_encoder_layers=1,
                      num_heads=3, head_dim=4, d_ff=40, max_seq_len=64, activation=activation, norm="rmsnorm",
                      norm_eps=1e-6, position="relative_bias", relative_attention_num_buckets=10,
                      relative_attention_max_distance=7, attention_scale=1.0, use_bias=False, tie_embeddings=False,
                      scale_head_inputs=True)
    graphdef, params = init_params(cfg, seed=1)
    params = jax.tree.map(lambda x: 6.0 * x, params)  # N(0, 0.12²): every parameter moves the logits
    hf.save(cfg, params, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["feed_forward_proj"] == t5.FEED_FORWARD_OUT[activation]
    model = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    assert model.lm_head.weight is not model.shared.weight
    source, target, lengths = tokens(2, 11), tokens(2, 8, seed=1), ([11, 5], [8, 3])
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(source), attention_mask=torch.tensor(attention_mask(lengths[0], 11)),
                       decoder_input_ids=torch.tensor(target),
                       decoder_attention_mask=torch.tensor(attention_mask(lengths[1], 8))).logits.numpy()
    ours = np.asarray(apply(graphdef, params, jnp.asarray(source), jnp.asarray(target),
                            source_lengths=jnp.asarray(lengths[0]), target_lengths=jnp.asarray(lengths[1]))[0])
    assert np.abs(theirs).max() > 1.0
    for b, n in enumerate(lengths[1]):
        assert np.abs(theirs[b, :n] - ours[b, :n]).max() <= TOLERANCE
    cfg2, params2 = hf.load(tmp_path / "out")
    assert cfg2 == cfg
    first, second = flat_params(params), flat_params(params2)
    assert first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize(("fields", "head", "tied", "scaled"), [
    ({"scale_decoder_outputs": False, "tie_word_embeddings": True}, False, True, False),  # transformers 5, v1.1
    ({"scale_decoder_outputs": False, "tie_word_embeddings": True}, True, False, False),  # 5: a head of its own
    ({"tie_word_embeddings": False}, True, False, False),  # transformers 4: Flan-T5, T5 v1.1
    ({}, True, True, True),  # transformers 4: T5 (its pytorch_model.bin repeats the tied head)
])
def test_head_tying_and_rescaling_of_both_transformers_generations(fields, head, tied, scaled):
    config = {"model_type": "t5", "vocab_size": 64, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 1,
              "num_heads": 4, **fields}
    cfg = t5.to_config(config, {"shared.weight", *(["lm_head.weight"] if head else [])})
    assert (cfg.tie_embeddings, cfg.scale_head_inputs) == (tied, scaled)
    assert (cfg.num_layers, cfg.norm_eps, cfg.relative_attention_num_buckets, cfg.activation) == (1, 1e-6, 32, "relu")


@pytest.mark.parametrize(("change", "message"), [
    ({"feed_forward_proj": "gated-relu"}, "config.json: feed_forward_proj='gated-relu' is not supported"),
    ({"is_encoder_decoder": False}, "config.json: is_encoder_decoder=False is not supported"),
    ({"relative_attention_max_distance": 4}, "config.json: relative_attention_max_distance=4 is not supported"),
])
def test_unsupported_t5_checkpoints_fail_in_one_line_naming_the_field(change, message, tmp_path, capsys):
    hf_model("t5").save_pretrained(tmp_path / "src")
    config = json.loads((tmp_path / "src" / "config.json").read_text())
    (tmp_path / "src" / "config.json").write_text(json.dumps({**config, **change}))
    assert_refused_in_one_line(tmp_path / "src", tmp_path / "imported", message, capsys)


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(use_bias=True), "model.use_bias=True has no Hugging Face T5 equivalent"),
    (dict(attention_scale=None), "model.attention_scale=None has no Hugging Face T5 equivalent"),
    (dict(num_kv_heads=2), "model.num_kv_heads=2 has no Hugging Face T5 equivalent"),
    (dict(norm="layernorm"), "model.norm='layernorm' has no Hugging Face T5 equivalent"),
])
def test_t5_like_models_without_a_hugging_face_equivalent_are_refused(overrides, message, tmp_path):
    base = dict(family="encoder_decoder", vocab_size=64, d_model=16, num_heads=4, num_layers=1, num_encoder_layers=1,
                max_seq_len=16, norm="rmsnorm", position="relative_bias", attention_scale=1.0, use_bias=False,
                activation="relu")
    cfg = ModelConfig(**{**base, **overrides})
    with pytest.raises(ValueError, match=message):
        hf.save(cfg, init_params(cfg, 0)[1], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_more_decoder_than_encoder_layers_generate_as_transformers_does_without_its_cache(tmp_path):
    """T5 v1.1 with 1 encoder and 2 decoder layers: transformers 5.25's own model (no export involved) fails in
    ``generate`` with ``IndexError: list index out of range`` (cache_utils.py: its DynamicCache is sized by
    ``num_hidden_layers``, which T5Config maps to ``num_layers``, the encoder's count). Our export writes the same
    ``num_layers`` / ``num_decoder_layers`` as the native config, and greedy generation without transformers' cache
    is the same, token for token, from the native model, the export and jaxformer (KV cache)."""
    from flax import nnx

    import jaxformer

    model = hf_model("t5-v1_1")
    model.save_pretrained(tmp_path / "src")
    cfg, params = hf.load(tmp_path / "src")
    hf.save(cfg, params, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["num_layers"], config["num_decoder_layers"]) == (model.config.num_layers,
                                                                    model.config.num_decoder_layers) == (1, 2)
    exported = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    prompt = tokens(1, 6, seed=3)
    greedy = dict(attention_mask=torch.ones(1, 6, dtype=torch.long), max_new_tokens=10, do_sample=False,
                  use_cache=False)
    with torch.no_grad():
        native, ours_in_theirs = (m.generate(torch.tensor(prompt), **greedy)[0, 1:].tolist() for m in (model, exported))
    generated = jaxformer.generate(nnx.merge(init_params(cfg, 0)[0], params), prompt[0], max_new_tokens=10,
                                   temperature=0.0, start_token=0)
    assert native == ours_in_theirs == [int(t) for t in generated] and len(set(native)) > 1
