"""KV-cache decoding equals full recomputation; generate() and `jaxformer generate`, including bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx
from model_helpers import TINY, jit_forward, tiny, tokens

import jaxformer
from jaxformer.cli import main
from jaxformer.models import KVCache, apply, build_model


def jit_extend(model):
    graphdef, state = nnx.split(model)
    extend = jax.jit(lambda state, *args: nnx.merge(graphdef, state).extend(*args))
    return lambda *args: extend(state, *args)


def decode_in_steps(extend, x_BT, cache, prefill, *context):
    """Logits of ``x`` computed as a prefill of ``prefill`` tokens then one token at a time."""
    logits, cache = extend(x_BT[:, :prefill], *context, cache)
    pieces = [logits]
    for t in range(prefill, x_BT.shape[1]):
        logits, cache = extend(x_BT[:, t:t + 1], *context, cache)
        pieces.append(logits)
    return jnp.concatenate(pieces, axis=1), cache


@pytest.mark.parametrize("overrides", [
    dict(position="rope", num_heads=4, num_kv_heads=2, sliding_window=4, activation="swiglu", norm="rmsnorm"),
    dict(position="learned", norm_position="post", use_bias=True),
    # MoE at the default capacity_factor (1.25): inference never drops, so routing does not depend on the batch
    dict(position="alibi", num_experts=4, experts_per_token=2, norm_position="sandwich"),
    # T5's causal relative buckets (distances past 6 share one), unscaled scores, a rescaled head
    dict(position="relative_bias", relative_attention_num_buckets=8, relative_attention_max_distance=6,
         attention_scale=1.0, norm="rmsnorm", activation="geglu_tanh", scale_head_inputs=True),
])
def test_cached_decoding_equals_full_recomputation(overrides):
    cfg = tiny(num_layers=2, **overrides)
    model = build_model(cfg, rngs=nnx.Rngs(0))
    x = tokens(2, 10)
    full, _ = jit_forward(model)(x)
    stepped, cache = decode_in_steps(jit_extend(model), x, KVCache.create(cfg, 2, 12), prefill=6)
    assert int(cache.length) == 10
    np.testing.assert_allclose(stepped, full, atol=1e-5, rtol=0)


def test_moe_cached_decoding_and_generation_equal_recomputation_at_the_default_capacity():
    cfg = tiny(num_layers=2, num_experts=4, experts_per_token=2)
    assert cfg.capacity_factor == 1.25  # C = ceil(1.25 · 32 · 2 / 4) = 20 of 32 rows per expert
    model = build_model(cfg, rngs=nnx.Rngs(0))
    x = tokens(2, 16)
    forward = jit_forward(model)
    full, _ = forward(x)
    stepped, _ = decode_in_steps(jit_extend(model), x, KVCache.create(cfg, 2, 16), prefill=6)
    np.testing.assert_allclose(stepped, full, atol=1e-5, rtol=0)
    # the training forward drops assignments at this capacity: it is the one that differs
    graphdef, state = nnx.split(model)
    training, _ = jax.jit(lambda state, x: apply(graphdef, state, x, drop_tokens=True))(state, x)
    assert float(jnp.max(jnp.abs(training - full))) > 1e-3
    # greedy generation (prefill + one jitted step per token) picks the full forward's argmax at every step
    prompt = x[:, :6]
    generated = jaxformer.generate(model, prompt, max_new_tokens=10, temperature=0.0)
    sequence = jnp.concatenate([prompt, generated], axis=1)
    logits, _ = forward(sequence[:, :-1])
    np.testing.assert_array_equal(jnp.argmax(logits[:, 5:], axis=-1), generated)


def test_encoder_decoder_cached_decoding_equals_full_recomputation():
    cfg = tiny(family="encoder_decoder", position="rope")
    model = build_model(cfg, rngs=nnx.Rngs(0))
    source, target = tokens(2, 7, seed=1), tokens(2, 6, seed=2)
    full, _ = jit_forward(model)(source, target)
    context_kvs = model.context_kvs(source)  # the encoder runs once; cross-attention K/V are reused every step
    stepped, _ = decode_in_steps(jit_extend(model), target, KVCache.create(cfg, 2, 6), 3, context_kvs)
    np.testing.assert_allclose(stepped, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("prefill", [2, 7])
def test_a_sliding_window_ring_cache_decodes_like_full_recomputation(prefill):
    cfg = tiny(position="alibi", sliding_window=4)
    model = build_model(cfg, rngs=nnx.Rngs(0))
    x = tokens(1, 12, seed=3)
    full, _ = jit_forward(model)(x)
    extend = jit_extend(model)
    stepped, cache = decode_in_steps(extend, x, KVCache.create(cfg, 1, 12), prefill=prefill)
    assert cache.slots == 4  # the window, not the 12 positions
    np.testing.assert_allclose(stepped, full, atol=1e-5, rtol=0)
    # a multi-token extension of a non-empty ring is not supported: NaN, never a wrong number
    logits, _ = extend(x[:, :2], cache)
    assert np.isnan(np.asarray(logits)).all()


@pytest.mark.parametrize("window, slots", [(None, 16), (4, 4)])
def test_cache_size_is_the_accounting_formula(window, slots):
    cfg = tiny(num_layers=2, num_heads=4, num_kv_heads=2, sliding_window=window)
    cache = KVCache.create(cfg, batch=3, max_len=16)
    # 2 (K and V) · 2 layers · 2 kv heads · head_dim 4 · slots · 4 bytes · batch 3
    formula = jaxformer.accounting.kv_cache_bytes(cfg, 16, batch=3, bytes_per_value=4)
    assert cache.nbytes == formula == 2 * 2 * 2 * 4 * slots * 4 * 3


def test_the_smallest_cache_holds_one_token_of_one_sequence_and_empty_ones_are_refused():
    cfg = tiny(num_layers=2, num_heads=4, num_kv_heads=2)
    assert KVCache.create(cfg, batch=1, max_len=1).keys[0].shape == (1, 1, 2, 4)
    for batch, max_len in [(0, 8), (1, 0), (-1, 4)]:
        with pytest.raises(ValueError, match=f"^cache batch and max_len must be positive, got {batch} and {max_len}$"):
            KVCache.create(cfg, batch, max_len)


def test_greedy_generation_is_the_argmax_of_full_recomputation():
    model = build_model(tiny(position="rope"), rngs=nnx.Rngs(0))
    prompt = [3, 1, 4, 1, 5]
    new = jaxformer.generate(model, prompt, max_new_tokens=6, temperature=0.0)
    forward = jit_forward(model)
    # a fixed buffer, so one compile; the model is causal, so the unfilled tail is never seen
    sequence = np.zeros((1, TINY["max_seq_len"]), np.int32)
    sequence[0, :5] = prompt
    for t in range(5, 11):
        sequence[0, t] = int(jnp.argmax(forward(jnp.asarray(sequence))[0][0, t - 1]))
    np.testing.assert_array_equal(new, sequence[0, 5:11])


def test_sampling_is_reproducible_and_top_k_one_is_greedy():
    model = build_model(tiny(position="rope"), rngs=nnx.Rngs(0))
    prompt = jnp.array([[3, 1, 4], [2, 7, 1]])
    first = jaxformer.generate(model, prompt, max_new_tokens=5, temperature=1.5, top_p=0.9, seed=7)
    again = jaxformer.generate(model, prompt, max_new_tokens=5, temperature=1.5, top_p=0.9, seed=7)
    assert first.shape == (2, 5)
    np.testing.assert_array_equal(first, again)
    other = jaxformer.generate(model, prompt, max_new_tokens=5, temperature=1.5, top_p=0.9, seed=8)
    assert not np.array_equal(first, other)  # the tokens are the seed's
    greedy = jaxformer.generate(model, prompt, max_new_tokens=5, temperature=0.0)
    np.testing.assert_array_equal(jaxformer.generate(model, prompt, max_new_tokens=5, top_k=1, seed=3), greedy)


def test_generation_stops_once_every_row_has_sampled_a_stop_token():
    """A checkpoint's EOS ends generation (`jaxformer generate --hf` kept going past it): the tokens are those of an
    unstopped greedy run, cut after the step where the last row stopped, each row held at its stop token after it."""
    model = build_model(tiny(position="rope"), rngs=nnx.Rngs(0))
    prompt = jnp.array([[3, 1, 4], [2, 7, 1]])
    free = np.asarray(jaxformer.generate(model, prompt, max_new_tokens=12, temperature=0.0))
    stop = int(free[0, 3]) if free[0, 3] not in free[0, :3] else int(free[0, 2])
    first = [int(np.flatnonzero(row == stop)[0]) if stop in row else None for row in free]
    n = 12 if None in first else max(first) + 1
    expected = free[:, :n].copy()
    for row, at in enumerate(first):
        if at is not None:
            expected[row, at:] = stop
    stopped = jaxformer.generate(model, prompt, max_new_tokens=12, temperature=0.0, stop_tokens=[stop])
    np.testing.assert_array_equal(stopped, expected)
    one = jaxformer.generate(model, prompt[0], max_new_tokens=12, temperature=0.0, stop_tokens=(stop, 10**6))
    np.testing.assert_array_equal(one, free[0, :first[0] + 1])


def test_encoder_decoder_generates_from_a_start_token():
    model = build_model(tiny(family="encoder_decoder"), rngs=nnx.Rngs(0))
    new = jaxformer.generate(model, [5, 6, 7], max_new_tokens=4, temperature=0.0)
    assert new.shape == (4,) and int(new.max()) < TINY["vocab_size"]


@pytest.mark.parametrize("options, message", [
    (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
    (dict(temperature=-1.0), r"temperature must be >= 0, got -1.0"),
    (dict(max_new_tokens=0), r"max_new_tokens must be a positive integer, got 0"),
    (dict(prompt=list(range(17))), r"prompt length 17 is past the learned position table \(model.max_seq_len=16\)"),
    (dict(prompt=[1] * 10, max_new_tokens=8), r"prompt \(10 tokens\) \+ max_new_tokens \(8\): cache length 17 is past"),
    (dict(prompt=[40]), r"prompt token ids must be in \[0, 32\), got 40..40"),
    (dict(max_new_tokens=True), r"max_new_tokens must be a positive integer, got True"),
    (dict(max_new_tokens=2.0), r"max_new_tokens must be a positive integer, got 2.0"),
    (dict(top_k=2.0), r"top_k must be an integer in \[1, 32\], got 2.0"),
    (dict(prompt=[[1, 2], [3]]), r"prompt must be a \[T\] or \[B, T\] array of token ids: its rows have different"),
    (dict(family="encoder_decoder", start_token=32), r"start_token must be a token id in \[0, 32\), got 32"),
    (dict(family="encoder_decoder", start_token=-1), r"start_token must be a token id in \[0, 32\), got -1"),
])
def test_bad_generation_requests_are_one_line_errors(options, message):
    options = {"prompt": [1, 2], **options}
    model = build_model(tiny(family=options.pop("family", "decoder")), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=message):
        jaxformer.generate(model, options.pop("prompt"), **options)


def test_numpy_integers_are_integers():
    model = build_model(tiny(), rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(jaxformer.generate(model, np.array([1, 2]), max_new_tokens=np.int64(3), temperature=0.0),
                                  jaxformer.generate(model, [1, 2], max_new_tokens=3, temperature=0.0))


def test_encoders_do_not_generate():
    message = "generation needs a decoder or encoder_decoder model, got model.family 'encoder'"
    with pytest.raises(ValueError, match=message):
        jaxformer.generate(build_model(tiny(family="encoder"), rngs=nnx.Rngs(0)), [1, 2])


def test_cli_generates_from_a_config_and_from_a_run_directory(tmp_path, capsys):
    model_section = {**TINY, "vocab_size": 256, "position": "rope"}
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(model_section))
    assert main(["generate", str(tmp_path / "model.yaml"), "--prompt", "ab", "--max-new-tokens", "5",
                 "--temperature", "0"]) == 0
    from_config = capsys.readouterr().out
    assert from_config.startswith("ab")

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"model": model_section, "train": {"tokens": 1000, "seq_len": 16}}))
    assert main(["generate", str(run_dir), "--prompt", "ab", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out == from_config  # same seed, same untrained model
    assert "no checkpoint yet" in captured.err


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "x" * 17], "prompt length 17 is past the context (model.max_seq_len=16)"),
    (["--prompt", "hi", "--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message):
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"model": {**TINY, "vocab_size": 256, "position": "rope"}}))
    assert main(["generate", str(tmp_path / "model.yaml"), *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"jaxformer generate: error: {message}\n"


def test_cli_generates_from_a_trained_run(tmp_path, capsys):
    """A run trained on a deterministic cycle learns it; generating from its directory continues the cycle."""
    corpus = tmp_path / "cycle.txt"
    corpus.write_text("abcdefgh" * 4000)
    config = {"model": {"preset": "tiny", "d_model": 32, "num_layers": 1, "num_heads": 2, "max_seq_len": 64},
              "data": {"corpus": f"files:{corpus}", "val_fraction": 0.0001, "doc_bytes": 2048},
              "train": {"tokens": 48_000, "batch_size": 16, "seq_len": 32, "eval_tokens": 1024},
              "optimizer": {"lr": 1e-2}, "checkpoint": {"interval": 1000}, "logging": {"tensorboard": False}}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    assert main(["train", str(tmp_path / "train.yaml"), "logging.progress=none", "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["generate", str(run_dir), "--prompt", "abcdefgh", "--max-new-tokens", "8", "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert "restored" in captured.err
    assert captured.out.strip() == "abcdefghabcdefgh"

    # a run saved by an older version (attention keys in the model section) loads through the same path
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    kernel = saved.pop("kernel")
    saved["model"].update(attention_impl=kernel["attention_impl"], attention_query_blocks=2)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    assert main(["generate", str(run_dir), "--prompt", "abcdefgh", "--max-new-tokens", "8", "--temperature", "0"]) == 0
    older = capsys.readouterr()
    assert older.out == captured.out
    assert "note: model.attention_query_blocks is deprecated: it is no longer used (ignored)" in older.err


def test_cli_generates_from_a_bpe_run_with_the_runs_own_tokenizer(tmp_path, capsys):
    """The prompt is encoded, and the continuation decoded, with the run's saved tokenizer.json, not with bytes."""
    from jaxformer.commands.generate import load_model
    from jaxformer.train.tokenizer import BPETokenizer

    corpus = tmp_path / "cycle.txt"
    corpus.write_text("the cat sat on the mat. " * 3000)
    config = {"model": {"preset": "tiny", "d_model": 32, "num_layers": 1, "num_heads": 2, "max_seq_len": 64,
                        "vocab_size": 320},
              "data": {"corpus": f"files:{corpus}", "tokenizer": "bpe", "bpe_vocab_size": 300, "val_fraction": 0.0001,
                       "doc_bytes": 2048},
              "train": {"tokens": 16_384, "batch_size": 16, "seq_len": 32, "eval_tokens": 1024},
              "optimizer": {"lr": 1e-2}, "checkpoint": {"interval": 1000}, "logging": {"tensorboard": False}}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    assert main(["train", str(tmp_path / "train.yaml"), "logging.progress=none", "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    model, tokenizer = load_model(str(run_dir), None, 0)
    saved = BPETokenizer.load(run_dir / "tokenizer.json")
    prompt = "the cat sat"
    ids = [int(t) for t in saved.encode(prompt)]
    assert [int(t) for t in tokenizer.encode(prompt)] == ids and max(ids) >= 256 and len(ids) < len(prompt)
    expected = prompt + saved.decode(jaxformer.generate(model, ids, max_new_tokens=6, temperature=0.0))
    assert main(["generate", str(run_dir), "--prompt", prompt, "--max-new-tokens", "6", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == expected.strip() and "<" not in out  # no out-of-byte-range ids printed as <id>
    # the same run's tokenizer.json damaged (JSON, but no tokenizer): export-hf refuses it before restoring, where it
    # copied it as if whole (this run is the suite's one BPE run with a checkpoint and no Hugging Face source)
    (run_dir / "tokenizer.json").write_text("{}\n")
    assert main(["export-hf", str(run_dir), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxformer export-hf: error: {run_dir / 'tokenizer.json'}: not a tokenizer the tokenizers "
                          "library reads (") and len(err.splitlines()) == 1 and "restored" not in err, err
    assert not (tmp_path / "hf").exists()
