"""The run's configuration, its learning-rate schedule sized to D, and checkpoints that fall back past bad ones."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import yaml

from jaxformer.train.checkpoint import CheckpointError, Checkpointer
from jaxformer.train.config import (
    ConfigDeprecation,
    config_from_dict,
    config_to_dict,
    load_config,
    resume_conflict,
)
from jaxformer.train.optimizer import learning_rate_schedule, learning_rates, make_optimizer
from jaxformer.train.optimizer_config import OptimizerConfig, warmup_steps


def test_yaml_plus_dotted_overrides_resolve_to_a_reloadable_config(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: {preset: tiny, num_layers: 1}\ntrain: {tokens: 1e6, batch_size: 8}\n")
    config = load_config(path, ["model.d_model=32", "train.tokens=2e6", "optimizer.lr=1e-3"])
    assert (config.model.d_model, config.model.num_layers, config.model.head_dim) == (32, 1, 8)  # re-derived
    assert config.model.position == "rope"  # from the preset
    assert config.train.tokens == 2_000_000 and config.optimizer.lr == 1e-3
    assert config.total_steps == -(-2_000_000 // (8 * 128))  # ceil(D / (batch · seq_len))
    resolved = yaml.safe_load(yaml.safe_dump(config_to_dict(config)))
    assert config_from_dict(resolved) == config


@pytest.mark.parametrize(("override", "message"), [
    ("train.tokens=0", "train.tokens must be positive, got 0"),
    ("train.tokens=-5e6", "train.tokens must be positive"),
    ("train.batch_size=many", "train.batch_size must be an integer, got 'many'"),
    ("train.colour=red", "unknown config key 'train.colour'"),
    ("model.d_modle=32", "unknown config key 'model.d_modle'"),
    ("optimizer.lr=-1", "optimizer.lr must be positive"),
    ("data.corpus=wikipedia", "data.corpus must be stdlib, files:GLOB"),
    ("train.seq_len=512", "train.seq_len 512 is past the context (model.max_seq_len=256)"),
    ("model.family=encoder", "model.family must be decoder"),
    ("train.grad_accum=3", "train.batch_size (32) must be a multiple of train.grad_accum (3)"),
    ("kernel.attention_query_block_size=0", "kernel.attention_query_block_size must be a positive integer, got 0"),
    ("train.seed=-1", "train.seed must be >= 0, got -1"),  # numpy's generator refused it at the run's start
    ("data.markov.seed=-1", "data.markov.seed must be >= 0, got -1"),  # likewise: 'expected non-negative integer'
])
def test_bad_values_raise_one_line_naming_the_field(override, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        load_config(None, [override])
    assert "\n" not in str(error.value)


def test_query_blocks_turn_off_with_null():
    assert load_config(None, []).kernel.attention_query_block_size == 64
    assert load_config(None, ["kernel.attention_query_block_size=null"]).kernel.attention_query_block_size is None


def test_moved_attention_keys_are_read_as_kernel_keys_with_a_one_line_note():
    with pytest.warns(ConfigDeprecation) as notes:
        config = load_config(None, ["model.attention_impl=blockwise", "model.attention_query_block_size=null"])
    assert sorted(str(note.message) for note in notes) == [
        "model.attention_impl is deprecated: use kernel.attention_impl",
        "model.attention_query_block_size is deprecated: use kernel.attention_query_block_size"]
    assert config.kernel.attention_impl == "blockwise" and config.kernel.attention_query_block_size is None
    assert "attention_impl" not in config_to_dict(config)["model"]
    with pytest.warns(ConfigDeprecation, match="model.attention_query_blocks is deprecated: it is no longer used"):
        assert load_config(None, ["model.attention_query_blocks=2"]).kernel == load_config(None, []).kernel


def test_learned_positions_bound_seq_len():
    with pytest.raises(ValueError, match=r"train.seq_len 300 is past the learned position table \(model.max_seq_len=256\)"):
        load_config(None, ["model.position=learned", "train.seq_len=300"])


def test_resume_conflict_names_the_changed_field():
    config = load_config(None, [])
    saved = config_to_dict(config)
    assert resume_conflict(saved, load_config(None, ["logging.interval=3", "checkpoint.keep=9"])) is None
    attention_path = ["kernel.attention_impl=blockwise", "kernel.attention_query_block_size=null"]
    assert resume_conflict(saved, load_config(None, attention_path)) is None
    saved_by_an_older_version = {**saved, "model": {**saved["model"], "attention_query_blocks": 2,
                                                    "attention_impl": "xla"}}
    assert resume_conflict(saved_by_an_older_version, config) is None
    assert resume_conflict(saved, load_config(None, ["train.tokens=3e6"])).startswith("train.tokens was 2000000")


@pytest.mark.parametrize("total_steps", [1, 2, 7, 489, 3000])
def test_schedule_reaches_its_final_value_exactly_at_the_last_step(total_steps):
    config = OptimizerConfig(lr=3e-3, warmup_fraction=0.05, final_lr_fraction=0.1)
    lrs = learning_rates(config, total_steps)
    assert lrs.shape == (total_steps,)  # one learning rate per update: the schedule is the run
    assert lrs[-1] == np.float32(3e-4)  # exactly, at the update that completes D tokens
    assert np.all(lrs > 0) and lrs.max() <= np.float32(3e-3)
    warmup = warmup_steps(config, total_steps)
    assert np.all(lrs[warmup:-1] > lrs[-1])  # after warmup, nowhere before D does it reach its end


def test_schedule_shape_warmup_peak_and_cosine_midpoint():
    config = OptimizerConfig(lr=1e-2, warmup_fraction=0.1, final_lr_fraction=0.0)
    lrs = learning_rates(config, 1000)
    assert warmup_steps(config, 1000) == 100
    assert lrs[0] == pytest.approx(1e-4, rel=1e-5) and lrs[99] == pytest.approx(1e-2)  # linear warmup, update k uses k+1
    assert lrs[549] == pytest.approx(5e-3, rel=1e-5)  # half-way through the cosine
    assert lrs[-1] == 0.0
    # exactly at the end for lr/fraction pairs where Optax's cosine lands an ulp off
    for lr, fraction, steps in [(0.0014945139248881535, 0.1, 4079), (0.026891628709146725, 0.0335855753, 3648)]:
        schedule = learning_rate_schedule(OptimizerConfig(lr=lr, final_lr_fraction=fraction), steps)
        assert schedule(steps - 1) == np.float32(lr * fraction)


@pytest.mark.parametrize("grad_clip", [1.0, 0.0])
def test_optimizer_steps_equal_pytorchs_adamw_with_clip_grad_norm(grad_clip):
    """The peer: torch.optim.AdamW (weight decay on the matrix only) after ``clip_grad_norm_`` when grad_clip > 0,
    over four updates at four learning rates whose gradients' global norms (0.40 to 55) fall on both sides of the
    clip: Adam's step is scale-free, so only gradients clipped by different factors tell a clip from none, and
    grad_clip 0 is no clip (not a clip to norm 0, which zeroes every update)."""
    import torch

    config = OptimizerConfig(weight_decay=0.5, grad_clip=grad_clip)
    rng = np.random.default_rng(0)
    start = {"w": rng.normal(size=(3, 4)).astype(np.float32), "scale": rng.normal(size=4).astype(np.float32)}
    grads = [{k: (g * rng.normal(size=v.shape)).astype(np.float32) for k, v in start.items()} for g in (20, 0.1, 5, 1)]
    rates = [1e-2, 3e-2, 2e-2, 5e-3]
    optimizer, params = make_optimizer(config), {k: jnp.asarray(v) for k, v in start.items()}
    state = optimizer.init(params)
    for g, lr in zip(grads, rates):  # as the train step: the update at unit rate, times the step's rate
        updates, state = optimizer.update({k: jnp.asarray(v) for k, v in g.items()}, state, params)
        params = optax.apply_updates(params, jax.tree.map(lambda u: lr * u, updates))
    peer = {k: torch.tensor(v, requires_grad=True) for k, v in start.items()}
    torch_optimizer = torch.optim.AdamW([{"params": [peer["w"]], "weight_decay": 0.5},
                                         {"params": [peer["scale"]], "weight_decay": 0.0}],
                                        betas=(config.beta1, config.beta2), eps=config.eps)
    clipped = []
    for g, lr in zip(grads, rates):
        for k, tensor in peer.items():
            tensor.grad = torch.tensor(g[k])
        if grad_clip:
            clipped.append(float(torch.nn.utils.clip_grad_norm_(list(peer.values()), grad_clip)) > grad_clip)
        for group in torch_optimizer.param_groups:
            group["lr"] = lr
        torch_optimizer.step()
    assert clipped == ([True, False, True, True] if grad_clip else [])  # three updates of four clipped, unequally
    for k, tensor in peer.items():
        np.testing.assert_allclose(np.asarray(params[k]), tensor.detach().numpy(), rtol=1e-5, atol=1e-7)
        assert not np.allclose(np.asarray(params[k]), start[k], atol=1e-3)  # every parameter moved


def test_no_bias_is_decayed_whatever_its_rank_and_every_matrix_is():
    """Attention's q/k/v biases are [H, D] and MoE experts' [X, F]: biases all the same (as transformers'
    Trainer, which decays no parameter named "bias"), T5's relative-position table with them."""
    from jaxformer.models import ModelConfig, init_params
    from jaxformer.train.optimizer import decay_mask

    configs = [ModelConfig(d_model=16, num_heads=2, num_layers=1, vocab_size=32, max_seq_len=8, use_bias=True,
                           num_experts=2, experts_per_token=1),
               ModelConfig(d_model=16, num_heads=2, num_layers=1, vocab_size=32, max_seq_len=8, use_bias=True,
                           family="encoder_decoder", num_encoder_layers=1, position="relative_bias")]
    decayed, kept = set(), set()
    for config in configs:
        params = init_params(config, 0)[1]
        for path, flag in jax.tree_util.tree_leaves_with_path(decay_mask(params)):
            (decayed if flag else kept).add(str(path[-2].key))
    assert {"bq", "bk", "bv", "b_in_XF", "b_out_XE", "relative_bias", "bo", "b_in", "scale"} <= kept
    assert decayed == {"tokens", "positions", "wq", "wk", "wv", "wo", "w_in", "w_out", "w_in_XEF", "w_out_XFE", "router"}
    pure = {"attention": {"bq": jnp.ones((2, 2)), "wq": jnp.ones((2, 2))}}  # nnx's to_pure_dict: no ".value" keys
    assert decay_mask(pure) == {"attention": {"bq": False, "wq": True}}
    params = {"bq": jnp.ones((2, 2)), "w": jnp.ones((2, 2))}  # one step of zero gradient: only decay moves them
    updates, _ = make_optimizer(OptimizerConfig(lr=1.0, weight_decay=0.5)).update(
        jax.tree.map(jnp.zeros_like, params), make_optimizer(OptimizerConfig(lr=1.0, weight_decay=0.5)).init(params),
        params)
    assert float(updates["bq"][0, 0]) == 0.0 and float(updates["w"][0, 0]) == -0.5


def _state(value: float):
    params = {"w": jnp.full((3, 2), value), "b": jnp.zeros(2)}
    return {"params": params, "opt_state": optax.adam(1e-3).init(params), "step": jnp.int32(value)}


def _restore(directory, abstract):
    checkpointer = Checkpointer(directory, keep=2)
    try:
        return checkpointer.restore_latest(abstract)
    finally:
        checkpointer.close()


def test_checkpoints_keep_last_k_and_fall_back_past_a_corrupt_latest(tmp_path, capsys):
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=2)
    for step in (1, 2, 3):
        checkpointer.save(step, _state(step), {"loader": {"position": 8 * step}})
    assert checkpointer.steps() == [2, 3]
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(0))
    checkpointer.close()
    step, state, meta = _restore(tmp_path / "checkpoints", abstract)
    assert (step, int(state["step"]), meta["loader"]["position"]) == (3, 3, 24)
    assert type(state["opt_state"][0]) is type(_state(0)["opt_state"][0])  # structure, not just arrays

    for chunk in (tmp_path / "checkpoints" / "3" / "state").rglob("d/*"):
        chunk.write_bytes(b"\0" * chunk.stat().st_size)  # same sizes, wrong bytes
    capsys.readouterr()
    step, state, meta = _restore(tmp_path / "checkpoints", abstract)
    assert step == 2 and float(state["params"]["w"][0, 0]) == 2.0
    warning = capsys.readouterr().err
    assert "checkpoint step 3 is unreadable" in warning and "falling back" in warning
    assert (tmp_path / "corrupt_checkpoints" / "3").is_dir()

    (tmp_path / "checkpoints" / "2" / "meta" / "metadata").write_text("{not json")
    with pytest.raises(CheckpointError) as error:  # never a silent restart from 0
        _restore(tmp_path / "checkpoints", abstract)
    reason = "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    assert f"checkpoint step 2 is unreadable ({reason}); moving it to" in capsys.readouterr().err
    assert str(error.value) == (f"none of the checkpoints [2] in {tmp_path / 'checkpoints'} could be restored (step 2: "
                                f"{reason}); they were moved to {tmp_path / 'corrupt_checkpoints'} (start a new run "
                                "directory to begin again)")
    assert sorted(p.name for p in (tmp_path / "corrupt_checkpoints").iterdir()) == ["2", "3"]
    assert _restore(tmp_path / "fresh", abstract) is None


def test_a_step_one_process_cannot_read_is_skipped_by_every_process(tmp_path, monkeypatch, capsys):
    """Process 1 of two (its answers through `exchange` played here; it holds no blocks) fails to read step 3 and
    reads step 2: this process skips step 3 too, and both digests of step 2 match — the processes stay in step."""
    from jaxformer.train import checkpoint

    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=2)
    for step in (2, 3):
        checkpointer.save(step, _state(step), {"loader": {"position": 8 * step}})
    checkpointer.close()
    peer = iter([b"", b"\x01" + np.zeros((len(jax.tree.leaves(_state(0))), 2), np.uint64).tobytes()])
    calls = []

    def exchange(name, value):
        calls.append(name)
        return [value, next(peer)] if name == "restore" else [value, value]

    monkeypatch.setattr(checkpoint, "exchange", exchange)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(0))
    step, state, _ = _restore(tmp_path / "checkpoints", abstract)
    assert step == 2 and float(state["params"]["w"][0, 0]) == 2.0
    assert calls == ["restore", "set-aside", "restore"]
    assert "checkpoint step 3 is unreadable (process 1 could not read it)" in capsys.readouterr().err
    assert (tmp_path / "corrupt_checkpoints" / "3").is_dir()


def test_an_asynchronous_save_keeps_the_state_it_was_given_while_training_donates_it(tmp_path):
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=3, asynchronous=True)
    step_fn = jax.jit(lambda state: jax.tree.map(lambda x: x + 1, state), donate_argnums=0)
    params = {"w": jnp.ones((1000, 500), jnp.int32), "b": jnp.zeros(2, jnp.int32)}  # 6 MB: writes that take a while
    state = {"params": params, "opt_state": optax.adam(1e-3).init(params), "step": jnp.int32(1)}
    for step in (1, 2, 3):
        checkpointer.save(step, state, {"loader": {"position": step}})
        assert checkpointer.saving == step  # returned before the write ends (a synchronous save waits: None)
        for _ in range(4):  # training donates the state it just handed to save while the write may be in flight
            state = step_fn(state)
    checkpointer.wait()
    assert checkpointer.steps() == [1, 2, 3]
    assert not list((tmp_path / "checkpoints").glob("*tmp*"))  # every step renamed into place
    checkpointer.close()
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    step, restored, meta = _restore(tmp_path / "checkpoints", abstract)  # the digest saved with it matches too
    assert (step, meta["loader"]["position"]) == (3, 3)
    assert int(restored["params"]["w"][999, 499]) == 9 and int(restored["step"]) == 9  # 1 + 4 + 4: as handed to save,
    # not as training left that memory (while Orbax holds the arrays, XLA gives the donating step fresh buffers)


def test_the_state_digest_sees_one_bit_and_compiles_once_per_leaf_shape():
    from jaxformer.train.checkpoint import state_digest

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration"
        else None)
    moment = np.arange(37 * 5, dtype=np.float32).reshape(37, 5) / 7  # shapes no other test fingerprints
    state = {"params": moment, "mu": moment * 2, "nu": moment * 3, "step": np.arange(3 * 37, dtype=np.int32)}
    before = len(compiles)
    digest = state_digest(state)
    assert len(compiles) - before == 2  # one program for the three [37, 5] float32 leaves, one for the int32 one
    assert state_digest({**state}) == digest and len(compiles) - before == 2
    flipped = moment.copy()
    flipped.view(np.uint32)[36, 4] ^= 1  # the lowest bit of the last element
    assert state_digest({**state, "nu": flipped}) != digest
    assert state_digest({**state, "mu": state["nu"], "nu": state["mu"]}) != digest  # where a value sits counts


def test_the_state_digest_is_the_one_checkpoints_were_saved_with():
    """Every checkpoint holds its state's digest, checked on restore: a digest computed otherwise (another hash,
    another index order, bool or bfloat16 leaves read another way) would set every checkpoint saved before aside
    as corrupt. This state's digest is the one the checkpoints of 2026-12 were saved with."""
    from jaxformer.train.checkpoint import params_digest, state_digests

    values = np.arange(-60, 60, dtype=np.float32) / 7
    state = {"params": {"w": values.reshape(12, 10), "bf": values.reshape(4, 5, 6).astype(jnp.bfloat16)},
             "mask": values > 1, "i8": values.astype(np.int8).reshape(2, 60), "step": np.int32(7)}
    assert state_digests(state) == {
        "digest": "76be555ee3f536966a0228397a3f62b969585b807233a037714e2ad1e2115624",
        "params_digest": "f57915aec685742dfee5f49015c1008f742c3d9ced1d7b5564e28b52dff8faeb"}
    assert params_digest(state["params"]) == state_digests(state)["params_digest"]  # read without the rest
