"""Exact accounting reproduces the seeds' tables and published parameter counts."""

import dataclasses
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxformer.accounting import (
    attention_crossover_length,
    attention_flop_share,
    count_params,
    forward_flops_per_token,
    kv_cache_bytes,
    training_flops,
    training_flops_per_token,
)
from jaxformer.cli import main
from jaxformer.models import PRESETS, KVCache, ModelConfig, build_model, get_preset


def test_gpt2_small_exact_count_and_breakdown():
    params = count_params(get_preset("gpt2"))
    assert params.total == 124_439_808
    assert params.breakdown["token_embedding"] == 38_597_376
    assert params.breakdown["position_embedding"] == 786_432
    assert params.breakdown["output_head"] == 0  # tied
    layer = params.per_layer
    assert (layer["decoder.attention"], layer["decoder.feed_forward"], layer["decoder.norms"]) == (2_362_368, 4_722_432, 3_072)
    assert layer["decoder.total"] == 7_087_872 and 12 * layer["decoder.total"] == 85_054_464
    assert params.breakdown["norms"] - 12 * 3_072 == 1_536  # the final layer norm


@pytest.mark.parametrize(("name", "published"), [("gpt2-medium", 354_823_168), ("llama2-7b", 6_738_415_616),
                                                 ("llama3-8b", 8_030_261_248), ("mistral-7b", 7_241_732_096),
                                                 ("t5-small", 60_506_624)])
def test_published_parameter_counts(name, published):
    assert count_params(get_preset(name)).total == published


def test_problem_12_6_twenty_four_layers_of_12d2_plus_13d():
    layer = count_params(get_preset("gpt2-medium")).per_layer["decoder.total"]
    assert layer == 12 * 1024 ** 2 + 13 * 1024
    assert 24 * layer == 302_309_376


@pytest.mark.parametrize(("d", "attention", "ffn"), [(768, 2_359_296, 4_718_592), (1024, 4_194_304, 8_388_608),
                                                     (4096, 67_108_864, 134_217_728), (8192, 268_435_456, 536_870_912)])
def test_twelve_d_squared_per_block(d, attention, ffn):
    cfg = ModelConfig(d_model=d, num_heads=8, num_layers=1, use_bias=False)
    layer = count_params(cfg).per_layer
    assert (layer["decoder.attention"], layer["decoder.feed_forward"]) == (attention, ffn)
    assert attention + ffn == 12 * d * d


def test_seven_billion_from_four_numbers():
    cfg = ModelConfig(vocab_size=32_000, d_model=32 * 128, num_heads=32, num_layers=32, use_bias=False,
                      tie_embeddings=False, norm="rmsnorm", position="rope")
    assert round(count_params(cfg).total / 1e9, 2) == 6.70


def test_llama3_block_shares():
    layer = count_params(get_preset("llama3-8b")).per_layer
    d2 = 4096 ** 2
    assert layer["decoder.attention"] / d2 == pytest.approx(2.5)
    assert layer["decoder.feed_forward"] / d2 == pytest.approx(10.5)
    assert layer["decoder.feed_forward"] / (layer["decoder.attention"] + layer["decoder.feed_forward"]) == pytest.approx(0.81, abs=0.005)


def _seven_b(kv_heads: int, layers: int = 32, heads: int = 32) -> ModelConfig:
    return ModelConfig(d_model=heads * 128, num_heads=heads, num_kv_heads=kv_heads, num_layers=layers,
                       max_seq_len=100_000, position="rope", use_bias=False)


@pytest.mark.parametrize(("cfg", "tokens", "gigabytes"), [
    (_seven_b(32), 4_096, 2.1), (_seven_b(32), 32_768, 17.2), (_seven_b(64, layers=80, heads=64), 32_768, 85.9),
    (_seven_b(32), 100_000, 52.4), (_seven_b(8), 100_000, 13.1), (_seven_b(1), 100_000, 1.6),
    (_seven_b(8, layers=80, heads=64), 32_768, 10.7),
])
def test_kv_cache_table(cfg, tokens, gigabytes):
    assert round(kv_cache_bytes(cfg, tokens) / 1e9, 1) == gigabytes


def _decode_arrays_bytes(cfg: ModelConfig, batch: int, tokens: int, source_tokens: int) -> int:
    """Bytes of what `jaxformer.generate` holds while it decodes (shapes only, nothing allocated): the `KVCache`,
    and an encoder–decoder's cross-attention keys and values of the source."""
    arrays = jax.eval_shape(lambda: KVCache.create(cfg, batch, tokens)).layers()
    if cfg.family == "encoder_decoder":
        graphdef, state = nnx.split(nnx.eval_shape(lambda: build_model(cfg, rngs=nnx.Rngs(0))))
        source = jax.ShapeDtypeStruct((batch, source_tokens), jnp.int32)
        arrays += jax.eval_shape(lambda s, x: nnx.merge(graphdef, s).context_kvs(x), state, source)
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(arrays))


@pytest.mark.parametrize(("preset", "tokens"), [("gpt2", 1024), ("mistral-7b", 5000), ("t5-small", 512)])
def test_kv_cache_bytes_are_the_bytes_a_decode_holds(preset, tokens):
    """An encoder–decoder's cross-attention keys and values of the source were left out (half of T5's cache)."""
    cfg = get_preset(preset)
    counted = kv_cache_bytes(cfg, tokens, batch=2, bytes_per_value=4, source_tokens=tokens // 3)
    assert counted == _decode_arrays_bytes(cfg, 2, tokens, tokens // 3)
    assert kv_cache_bytes(cfg, tokens) * 2 * 2 == _decode_arrays_bytes(cfg, 2, tokens, tokens)


def test_an_encoder_holds_no_kv_cache(capsys):
    """bert-base counted "KV cache 0.019 GB for 512 tokens", though an encoder never decodes."""
    assert kv_cache_bytes(get_preset("bert-base"), 512) == 0
    assert main(["count", "--preset", "bert-base", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_cache_bytes"] == 0
    assert main(["count", "--preset", "bert-base"]) == 0
    assert "KV cache" not in capsys.readouterr().out
    assert main(["count", "--preset", "t5-small", "--seq-len", "100"]) == 0  # 2 · 6 · 8 · 64 · (100 + 100) · 2
    assert "KV cache                      0.002 GB  for 100 tokens (and 100 source tokens)" in capsys.readouterr().out


@pytest.mark.parametrize(("d", "n", "share"), [(768, 1024, 0.18), (768, 4608, 0.50), (768, 32_768, 0.88),
                                               (4096, 4096, 0.14), (4096, 24_576, 0.50), (4096, 100_000, 0.80)])
def test_attention_share_table(d, n, share):
    cfg = ModelConfig(d_model=d, num_heads=d // 64, max_seq_len=n)
    assert round(attention_flop_share(cfg, n), 2) == share
    assert attention_crossover_length(cfg) == 6 * d


def test_moe_total_versus_active():
    moe = count_params(get_preset("moe-8x-top2"))
    layers = lambda b: b["attention"] + b["feed_forward"] + b["router"] + b["norms"]
    assert round(layers(moe.breakdown) / 1e9, 1) == 36.5
    active_layers = moe.active - moe.breakdown["token_embedding"] - moe.breakdown["output_head"]
    assert round(active_layers / 1e9, 1) == 10.7
    # what the 6ND_non_embedding rule counts: the same active layers and the (untied) head, no embedding table
    assert round((moe.active_non_embedding - moe.breakdown["output_head"]) / 1e9, 1) == 10.7
    dense = ModelConfig(d_model=4096, num_heads=32, num_layers=32, use_bias=False, norm="rmsnorm", position="rope")
    assert round(count_params(dense).per_layer["decoder.total"] * 32 / 1e9, 1) == 6.4


def test_gpt2_forward_cost_is_about_142_million_multiply_adds_per_token():
    flops = forward_flops_per_token(get_preset("gpt2"), 1024)
    assert flops.attention == 12 * 2 * 2 * 1024 * 768
    assert flops.total / 2 / 1e6 == pytest.approx(142, abs=0.5)


def test_a_sliding_window_bounds_the_causal_layers_attention_only():
    """An encoder's layers see the whole sequence whatever ``sliding_window`` says (its outputs are the same); an
    encoder–decoder's decoder self-attention is windowed, its encoder and cross-attention are not."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxformer.models import apply, init_params

    base = dict(d_model=32, num_heads=4, num_layers=1, vocab_size=64, max_seq_len=32)
    per_layer = 4 * 32 * 32  # 2·2·seq_len·H·Dh over the whole sequence of 32
    encoder = ModelConfig(family="encoder", sliding_window=4, **base)
    assert forward_flops_per_token(encoder, 32).attention == per_layer
    tokens = jnp.arange(32)[None] % 64
    outputs = [apply(*init_params(cfg, 0), tokens) for cfg in (encoder, dataclasses.replace(encoder, sliding_window=None))]
    for ours, unwindowed in zip(*(jax.tree.leaves(output) for output in outputs), strict=True):
        np.testing.assert_array_equal(ours, unwindowed)
    no_window = dataclasses.replace(encoder, sliding_window=None)
    assert attention_flop_share(encoder, 32) == attention_flop_share(no_window, 32)
    both = ModelConfig(family="encoder_decoder", num_encoder_layers=1, sliding_window=4, **base)
    assert forward_flops_per_token(both, 32).attention == per_layer + per_layer // 8 + per_layer  # 4 of 32 keys


def test_training_flops_exact_versus_6nd():
    cfg = get_preset("llama2-7b")
    train = training_flops(cfg, 1e12, 2048)
    assert train["6ND"] == 6 * count_params(cfg).total * 1e12
    assert train["exact"] / train["6ND"] == pytest.approx(1.0, abs=0.1)  # attention adds, embeddings subtract
    # the exact count written out (Hoffmann et al. 2022, App. F; 2 FLOPs a multiply-add, backward twice forward):
    # per layer 4d² attention and 3·d·11008 SwiGLU weights, the untied 32000-row head, and 2·2·T·d attention
    d, layers, seq_len = 4096, 32, 2048
    weights = layers * (4 * d * d + 3 * d * 11_008) + d * 32_000
    attention = layers * 4 * seq_len * d
    assert train["exact"] == 3 * (2 * weights + attention) * 1e12 == 4.2863689728e22


def test_training_flops_per_token_is_the_one_rule_and_counts_active_moe_parameters():
    moe = get_preset("moe-8x-top2")
    params = count_params(moe)
    assert training_flops_per_token(moe, 2048, "6ND") == 6 * params.active < 6 * params.total
    assert training_flops_per_token(moe, 2048, "6ND_non_embedding") == 6 * params.active_non_embedding
    assert training_flops_per_token(moe, 2048) == 3 * forward_flops_per_token(moe, 2048).total  # "exact"
    train = training_flops(moe, 1e12, 2048)
    rules = ("6ND", "6ND_non_embedding", "exact")
    assert train == {rule: training_flops_per_token(moe, 2048, rule) * 1e12 for rule in rules}
    with pytest.raises(ValueError, match="rule must be one of"):
        training_flops_per_token(moe, 2048, "6N")


def test_t5_forward_matmuls_are_two_flops_per_matrix_weight():
    """T5 (no biases, tied head): one token multiplies every weight outside the embedding table, the norms' gains and
    the relative-bias tables once per layer it passes — encoder, decoder self- and cross-attention — and the tied
    table once more as its head."""
    t5 = get_preset("t5-small")
    params = count_params(t5)
    matrices = params.total - sum(params.breakdown[name] for name in ("token_embedding", "norms", "relative_bias"))
    assert forward_flops_per_token(t5, 512).matmul == 2 * (matrices + t5.d_model * t5.vocab_size)


@pytest.mark.parametrize("shared", [0, 1])
def test_moe_forward_matmuls_are_two_flops_per_active_weight(shared):
    """No biases, untied head: every active parameter but the embedding table and the norms' gains is a matrix
    weight a token multiplies once (its k routed experts, the shared ones, the router, the head)."""
    moe = dataclasses.replace(get_preset("moe-8x-top2"), num_shared_experts=shared)
    params = count_params(moe)
    multiplied = params.active - params.breakdown["token_embedding"] - params.breakdown["norms"]
    assert forward_flops_per_token(moe, 2048).matmul == 2 * multiplied


def test_every_preset_counts_and_family_extras():
    for name, cfg in PRESETS.items():
        params = count_params(cfg)
        assert params.total == sum(params.breakdown.values()), name
    assert count_params(get_preset("bert-base")).breakdown["mlm_head"] == 768 * 768 + 768 + 2 * 768 + 30522
    assert count_params(get_preset("transformer-base")).breakdown["cross_attention"] == 6 * (4 * 512 ** 2 + 4 * 512)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"d_model": 0}, "model.d_model"),
    ({"num_heads": 6, "num_kv_heads": 4, "d_model": 48}, r"num_heads \(6\).*num_kv_heads \(4\)"),
    ({"d_model": 50, "num_heads": 4}, r"d_model \(50\).*num_heads \(4\)"),
    ({"activation": "tanh"}, "model.activation"),
    ({"num_experts": 4, "experts_per_token": 5}, "experts_per_token"),
    ({"family": "encoder_decoder"}, "num_encoder_layers"),
    ({"rope_scaling": "llama3", "rope_low_freq_factor": 4.0, "rope_high_freq_factor": 1.0}, "rope_high_freq_factor"),
    ({"family": "encoder", "logit_bias": True}, "model.logit_bias"),
    ({"pooler": True}, "model.pooler needs family encoder"),
    ({"mlm_head": False}, "model.mlm_head=false needs family encoder"),
    ({"activation": "gelu_new"}, "model.activation"),
    ({"family": "encoder", "scale_head_inputs": True}, "model.scale_head_inputs"),
    ({"position": "relative_bias", "relative_attention_num_buckets": 32, "relative_attention_max_distance": 16},
     r"model.relative_attention_max_distance \(16\) must be above half of model.relative_attention_num_buckets"),
    ({"attention_scale": 0.0}, "model.attention_scale"),
    ({"norm_eps": -1.0}, "model.norm_eps must be positive, got -1.0"),
    ({"norm_eps": 0.0}, "model.norm_eps must be positive, got 0.0"),
    ({"position": "rope", "d_model": 100, "num_heads": 4},
     r"model.head_dim must be even for rope, got 25 \(model.d_model 100 / num_heads 4\)$"),
    ({"position": "rope", "d_model": 100, "num_heads": 4, "head_dim": 25}, r"for rope, got 25$"),
])
def test_model_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


def test_hugging_face_options_are_counted_and_leave_the_presets_alone():
    """BERT's token types, embedding LayerNorm and pooler; a headless encoder; a logit bias; q/k/v-only biases."""
    d, vocab, positions = 384, 30522, 512
    minilm = ModelConfig(family="encoder", vocab_size=vocab, d_model=d, num_layers=6, num_heads=12, d_ff=1536,
                         max_seq_len=positions, norm_position="post", num_token_types=2, embedding_norm=True,
                         pooler=True, mlm_head=False)
    params = count_params(minilm)
    assert params.total == 22_713_216  # all-MiniLM-L6-v2 (sentence-transformers' BertModel)
    assert params.breakdown["token_type_embedding"] == 2 * d and params.breakdown["embedding_norm"] == 2 * d
    assert params.breakdown["pooler"] == d * d + d and "mlm_head" not in params.breakdown
    assert params.non_embedding == params.total - (vocab + positions + 2) * d
    head = forward_flops_per_token(dataclasses.replace(minilm, mlm_head=True, pooler=False), 128)
    assert head.matmul - forward_flops_per_token(minilm, 128).matmul == 2 * (d * d + d * vocab)
    qwen = ModelConfig(d_model=64, num_heads=4, num_kv_heads=2, use_bias=False, qkv_bias=True, logit_bias=True,
                       activation="swiglu", norm="rmsnorm", position="rope", vocab_size=100)
    base = count_params(dataclasses.replace(qwen, qkv_bias=None, logit_bias=False))
    assert count_params(qwen).total - base.total == 2 * (64 + 2 * 32) + 100
    for name, cfg in PRESETS.items():  # the new options default off
        assert count_params(cfg).breakdown.get("token_type_embedding", 0) == 0, name


def test_t5_relative_bias_tables_and_gated_gelu_are_counted():
    """One [buckets, heads] table per stack (an embedding, like the position tables); GEGLU's third matrix."""
    t5 = count_params(get_preset("t5-small"))
    assert t5.breakdown["relative_bias"] == 2 * 32 * 8 and t5.breakdown["output_head"] == 0
    assert t5.non_embedding == t5.total - 32128 * 512 - 2 * 32 * 8
    assert t5.per_layer["encoder.total"] == 4 * 512 * 512 + 2 * 512 * 2048 + 2 * 512  # no biases, RMSNorm
    v1_1 = dataclasses.replace(get_preset("t5-small"), activation="geglu_tanh", tie_embeddings=False)
    assert count_params(v1_1).total - t5.total == 12 * 512 * 2048 + 32128 * 512


def test_count_cli_prints_gpt2(capsys):
    assert main(["count", "--preset", "gpt2"]) == 0
    assert "124,439,808" in capsys.readouterr().out
    assert main(["count", "--preset", "gpt2", "--json", "--seq-len", "1024", "--tokens", "1e9"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["params"] == 124_439_808 and result["params_breakdown"]["token_embedding"] == 38_597_376


def test_count_cli_prints_a_mixtures_active_parameters_and_the_training_flops_its_json_holds(capsys):
    """Active per token: the total less the 6 unchosen experts' FFNs in each of 32 layers (6 · 32 · 2 · 4096 ·
    16384); 6ND counts the active parameters."""
    argv = ["count", "--preset", "moe-8x-top2", "--seq-len", "4096", "--tokens", "1e12"]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["params_active"] == 36_770_680_832 - 6 * 32 * 2 * 4096 * 16384 == 11_000_877_056
    assert result["training_flops"]["6ND"] == 6 * 11_000_877_056 * 1e12
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  active per token      11,000,877,056" in lines
    assert (f"training FLOPs      {result['training_flops']['exact']:>18.4g}  exact; 6ND = 6.601e+22") in lines


def test_count_cli_reads_a_config_file(tmp_path, capsys):
    path = tmp_path / "model.yaml"
    path.write_text("model:\n  preset: gpt2\n  num_layers: 24\n  d_model: 1024\n  num_heads: 16\n")
    assert main(["count", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == 354_823_168


@pytest.mark.parametrize(("argv", "message"), [
    (["count", "--preset", "gpt5"], "unknown preset 'gpt5'"),
    (["count"], "exactly one of"),
    (["count", "--preset", "gpt2", "--seq-len", "0"], "argument --seq-len: must be an integer at least 1, got 0"),
    (["count", "missing.yaml"], "config file not found: missing.yaml"),
])
def test_count_cli_bad_input_is_one_line_exit_2(argv, message):
    result = subprocess.run([sys.executable, "-m", "jaxformer.cli", *argv], capture_output=True, text=True)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_count_refuses_a_seq_len_past_the_learned_position_table(capsys):
    """gpt2 was counted at 100,000 tokens, 98,976 of which have no position embedding; RoPE has no such table."""
    assert main(["count", "--preset", "gpt2", "--seq-len", "100000"]) == 2
    err = capsys.readouterr().err
    assert err == ("jaxformer count: error: --seq-len 100000 is past the learned position table "
                   "(model.max_seq_len=1024)\n")
    assert main(["count", "--preset", "llama2-7b", "--seq-len", "100000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["seq_len"] == 100_000


def test_count_refuses_a_norm_eps_that_is_not_positive(tmp_path, capsys):
    (tmp_path / "eps.yaml").write_text("model:\n  norm_eps: -1\n")
    assert main(["count", str(tmp_path / "eps.yaml")]) == 2
    assert capsys.readouterr().err == "jaxformer count: error: model.norm_eps must be positive, got -1.0\n"


def test_count_cli_unknown_config_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  d_model: 64\n  num_head: 4\n")
    result = subprocess.run([sys.executable, "-m", "jaxformer.cli", "count", str(path)], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown config key 'model.num_head'" in result.stderr
