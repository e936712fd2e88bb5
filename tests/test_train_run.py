"""`jaxformer train` end to end: learning a source of known entropy, exact resume after SIGKILL, bad input."""

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxformer.accounting import count_params
from jaxformer.cli import main
from jaxformer.train.config import load_config
from jaxformer.parallel.config import DistributedConfig
from jaxformer.train.loop import train
from jaxformer.train.run_claim import claimed

# one model and batch shape for every run here, so JAX's persistent cache compiles the step once
TINY = ["model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.max_seq_len=64",
        "data.corpus=synthetic-markov", "data.markov.order=1", "data.markov.alphabet=32",
        "data.markov.bytes=400000", "optimizer.lr=1e-2", "train.batch_size=16", "train.seq_len=64",
        "train.eval_tokens=16384", "logging.progress=plain"]
CURVE_KEYS = ("step", "tokens", "train_loss", "grad_norm", "lr", "val_loss", "val_bits_per_byte")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla-cache"))


@pytest.fixture
def empty_yaml(tmp_path):
    """A config file with no keys: every run here is described by its overrides."""
    path = tmp_path / "run.yaml"
    path.write_text("{}\n")
    return str(path)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _curve(run_dir: Path) -> list[tuple]:
    return [tuple(row.get(key) for key in CURVE_KEYS) for row in _rows(run_dir)]


@pytest.mark.slow
def test_markov_source_val_loss_falls_far_below_unigram_entropy_to_near_the_entropy_rate(tmp_path, cache_dir):
    config = load_config(None, TINY + ["train.tokens=150000", "logging.interval=50", "train.eval_interval=50",
                                       f"train.compilation_cache={cache_dir}"])
    record = train(config, tmp_path / "run")
    rate = record["data"]["entropy_rate_bits_per_byte"]  # 1.507 bits/byte for this seed
    unigram = record["data"]["unigram_entropy_bits_per_byte"]  # 4.396
    bpb = record["val_bits_per_byte"]  # measured 1.574 (2026-11-29)
    assert bpb < unigram - 2.5  # context is being used: far below what symbol frequencies allow
    assert rate - 0.03 < bpb < rate + 0.15  # near the floor, and not below it (16K tokens: noise ~0.01)
    assert bpb == pytest.approx(record["val_loss"] / math.log(2))  # byte-level: a token is a byte

    steps = -(-150_000 // (16 * 64))
    params = count_params(config.model)
    assert (record["steps"], record["tokens"]) == (steps, steps * 16 * 64)
    assert (record["params"], record["params_non_embedding"]) == (params.total, params.non_embedding)
    assert record["flops_6nd"] == 6 * params.total * record["tokens"]
    assert record["flops_exact"] > record["flops_6nd_non_embedding"]
    rows = _rows(tmp_path / "run")
    assert [row["step"] for row in rows] == [50, 100, steps]
    assert rows[0]["val_bits_per_byte"] > rows[-1]["val_bits_per_byte"]
    assert rows[-1]["lr"] == pytest.approx(1e-3)  # the schedule ends at D: final_lr_fraction · lr
    # each row's rate is over its own window of steps: the windows' seconds add up to the run's training seconds
    windows = [(row["step"] - before) * 16 * 64 for before, row in zip([0] + [r["step"] for r in rows], rows)]
    assert sum(t / row["tokens_per_s"] for t, row in zip(windows, rows)) == pytest.approx(record["time"]["train_s"])
    flops_per_token = record["flops_exact"] / record["tokens"]
    assert all(row["mfu"] == pytest.approx(row["tokens_per_s"] * flops_per_token / record["peak_flops"])
               for row in rows)
    written = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert written == ["checkpoints", "config.yaml", "data.json", "final.json", "metrics.jsonl", "tensorboard"]
    assert any((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert load_config(tmp_path / "run" / "config.yaml") == config  # the resolved config reloads as is
    assert train(config, tmp_path / "run") == record  # resuming a finished run changes nothing


def _launch(config: str, run_dir: Path, cache_dir: str) -> subprocess.Popen:
    overrides = TINY + ["train.tokens=122880", "checkpoint.interval=10", "checkpoint.keep=3", "logging.interval=5",
                        "train.eval_interval=20", f"train.compilation_cache={cache_dir}"]
    command = [sys.executable, "-m", "jaxformer.cli", "train", config, *overrides, "--run-dir", str(run_dir)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _saved_steps(run_dir: Path) -> list[int]:
    """Finished checkpoint steps: Orbax writes ``N.orbax-checkpoint-tmp-*`` and renames it to ``N`` when whole."""
    directory = run_dir / "checkpoints"
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []


def _digest(run_dir: Path, step: int | None = None) -> str:
    """The state digest of checkpoint ``step`` (default the newest finished one)."""
    step = _saved_steps(run_dir)[-1] if step is None else step
    return json.loads((run_dir / "checkpoints" / str(step) / "meta" / "metadata").read_text())["digest"]


@pytest.mark.slow
def test_sigkill_then_resume_ends_bit_identical_even_past_a_corrupt_checkpoint(tmp_path, cache_dir, empty_yaml):
    reference = _launch(empty_yaml, tmp_path / "reference", cache_dir)
    out, err = reference.communicate(timeout=600)
    assert reference.returncode == 0, err

    killed_dir = tmp_path / "killed"
    victim = _launch(empty_yaml, killed_dir, cache_dir)
    deadline = time.monotonic() + 600
    while max(_saved_steps(killed_dir), default=0) < 30:
        assert victim.poll() is None and time.monotonic() < deadline, victim.stderr.read() if victim.poll() else ""
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    assert victim.returncode == -signal.SIGKILL
    saved = _saved_steps(killed_dir)
    assert 30 <= saved[-1] < 120  # killed mid-run, of 120 steps
    for chunk in (killed_dir / "checkpoints" / str(saved[-1]) / "state").rglob("d/*"):
        chunk.write_bytes(b"\0" * chunk.stat().st_size)  # and the newest checkpoint is corrupt

    resumed = _launch(empty_yaml, killed_dir, cache_dir)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert f"checkpoint step {saved[-1]} is unreadable" in err  # the fallback warns
    assert f"resumed from step {saved[-2]} (checkpoint {killed_dir.absolute() / 'checkpoints' / str(saved[-2])})" in err
    assert _digest(killed_dir) == _digest(tmp_path / "reference")  # params and optimizer state, bitwise
    assert _curve(killed_dir) == _curve(tmp_path / "reference")  # the whole loss curve, exactly
    final = json.loads((killed_dir / "final.json").read_text())
    reference_final = json.loads((tmp_path / "reference" / "final.json").read_text())
    assert (final["train_loss"], final["val_loss"]) == (reference_final["train_loss"], reference_final["val_loss"])
    assert final["wall_s"] > 0
    assert final["resumed_from"]["step"] == saved[-2] and reference_final["resumed_from"] is None
    # where the seconds went: parts of the run's own wall time (start-up, the process's before it began, is not one)
    for record in (final, reference_final):
        times = record["time"]
        assert all(0 <= times[part] <= times["total_s"] for part in times if part != "startup_s"), times
        assert times["compile_s"] > 0 and times["train_s"] > 0
    assert final["time"]["restore_s"] > reference_final["time"]["restore_s"]  # a checkpoint read, against a look
    # the fresh run's rates are over its own training seconds, its wall time that of the whole run
    ref, ref_times = reference_final, reference_final["time"]
    assert ref["tokens_per_s"] == pytest.approx(ref["tokens"] / ref_times["train_s"])
    assert ref["mfu"] == pytest.approx(ref["tokens_per_s"] * ref["flops_exact"] / ref["tokens"] / ref["peak_flops"])
    assert ref["wall_s"] == pytest.approx(ref_times["total_s"], rel=1e-3)
    assert ref["train_loss"] == pytest.approx(ref["val_loss"], rel=0.2)  # a mean over the window's steps, per token
    assert ref["epochs"] == pytest.approx(ref["tokens"] / ref["data"]["train_tokens"])  # passes over the train split
    resumed_tokens = (final["steps"] - final["resumed_from"]["step"]) * final["tokens"] / final["steps"]
    assert final["tokens_per_s"] == pytest.approx(resumed_tokens / final["time"]["train_s"])  # this segment's


def test_a_diverging_run_stops_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path, cache_dir, capsys,
                                                                                 empty_yaml):
    run_dir = tmp_path / "run"
    code = main(["train", empty_yaml, *TINY, "train.tokens=20480", "optimizer.lr=1e10", "optimizer.warmup_fraction=0.5",
                 "checkpoint.interval=1", "logging.interval=1", f"train.compilation_cache={cache_dir}",
                 "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert "non-finite loss, gradient or parameters at step 2" in err and "last good checkpoint is step 1" in err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["1"]
    assert json.loads((run_dir / "error.json").read_text())["error"] == "NonFiniteLoss"
    assert not (run_dir / "final.json").exists()


@pytest.mark.parametrize("mine", ["config.yaml", "metrics.jsonl", "tensorboard/events.out.tfevents.1.mine",
                                  "data.json"])
def test_a_folder_of_the_users_files_is_refused_as_it_is(tmp_path, capsys, empty_yaml, mine):
    """A fresh run replaced the config.yaml, dropped the metrics.jsonl rows and wrote TensorBoard events beside the
    user's own in a folder no run began in: exit 2 naming the file, the folder as it was, no error.json."""
    folder = tmp_path / "mine"
    (folder / mine).parent.mkdir(parents=True, exist_ok=True)
    (folder / mine).write_text('{"step": 1, "loss": 2.5}\n')  # a data.json that is no run's corpus record
    (folder / "notes.txt").write_text("mine\n")
    before = {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    assert main(["train", empty_yaml, *TINY, "train.tokens=20480", "--run-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err == (f"jaxformer train: error: {folder / mine.split('/')[0]} is not a run's: {folder} holds no run (no "
                   "data.json record of one), and a run there would replace it; give another run directory, or move "
                   "it\n")
    assert {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()} == before


def test_a_run_that_diverged_before_its_first_checkpoint_trains_again_from_the_start(tmp_path, cache_dir,
                                                                                     empty_yaml):
    """A run directory begun by an earlier attempt (its data.json, config, metrics, events and error.json, no
    checkpoint) is no folder of the user's (`refuse_others_files`): the run trains there again from the start."""
    run_dir = tmp_path / "run"
    tiny = [*TINY, "train.tokens=20480", "logging.interval=1", f"train.compilation_cache={cache_dir}"]
    diverging = ["optimizer.lr=1e10", "optimizer.warmup_fraction=0.5"]
    assert main(["train", empty_yaml, *tiny, *diverging, "--run-dir", str(run_dir)]) == 1
    assert json.loads((run_dir / "error.json").read_text())["error"] == "NonFiniteLoss"
    assert not any((run_dir / "checkpoints").glob("*")) and _rows(run_dir)[0]["step"] == 1
    assert main(["train", empty_yaml, *tiny, "--run-dir", str(run_dir)]) == 0
    assert not (run_dir / "error.json").exists() and json.loads((run_dir / "final.json").read_text())["steps"] == 20
    assert [row["step"] for row in _rows(run_dir)] == list(range(1, 21))  # the diverged attempt's rows replaced


@pytest.mark.parametrize(("arguments", "message"), [
    (["data.corpus=files:no/such/dir/*.txt"], "data.corpus 'files:no/such/dir/*.txt': no file matches"),
    # a directory for a glob said only "no file matches '{tmp}'"
    (["data.corpus=files:{tmp}"], "data.corpus 'files:{tmp}': '{tmp}' is a directory; give a glob of its files, such "
                                  "as '{tmp}/*.txt' ('{tmp}/**/*.txt' with subdirectories)"),
    (["data.corpus=files:{tmp}/small*.txt"], "fewer than one batch needs"),
    (["model.position=learned", "model.max_seq_len=32"], "train.seq_len 64 is past the learned position table"),
    (["train.epochs=3"], "unknown config key 'train.epochs'"),
    (["train.batch_size=[16]"], "train.batch_size must be an integer, got [16]"),
    (["train.tokens=0"], "train.tokens must be positive, got 0"),
    (["checkpoint.interval=-1"], "checkpoint.interval must be positive, got -1"),
])
def test_bad_input_exits_2_with_one_line_and_writes_only_an_error_record(tmp_path, capsys, empty_yaml, arguments,
                                                                        message):
    for name in ("small_a.txt", "small_b.txt"):
        (tmp_path / name).write_text("print('hello')\n" * 5)
    arguments, message = [a.replace("{tmp}", str(tmp_path)) for a in arguments], message.replace("{tmp}", str(tmp_path))
    run_dir = tmp_path / "run"
    assert main(["train", empty_yaml, *TINY, *arguments, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err
    assert [p.name for p in run_dir.iterdir()] == ["error.json"]
    assert json.loads((run_dir / "error.json").read_text())["error"] == "bad_input"


def test_missing_config_file_and_a_changed_config_on_resume_exit_2(tmp_path, capsys, empty_yaml):
    assert main(["train", str(tmp_path / "absent.yaml"), "--run-dir", str(tmp_path / "a")]) == 2
    assert "config file not found" in capsys.readouterr().err
    run_dir = tmp_path / "b"
    (run_dir / "checkpoints" / "10").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("train: {tokens: 1000}\n")
    assert main(["train", empty_yaml, *TINY, "train.tokens=5000", "--run-dir", str(run_dir)]) == 2
    assert "cannot resume" in capsys.readouterr().err


def test_a_run_directory_another_process_trains_is_refused_and_left_as_it_is(tmp_path, empty_yaml):
    """The holder here is this process (`claimed`, the lock `train` takes); the refused `jaxformer train` is a
    process of its own. A file given as the run directory is bad input too."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "jaxformer.cli", "train", empty_yaml, *TINY, "train.tokens=5000"]
    with claimed(run_dir, DistributedConfig()):
        busy = subprocess.run([*command, "--run-dir", str(run_dir)], capture_output=True, text=True)
    assert busy.returncode == 2 and len(busy.stderr.strip().splitlines()) == 1, busy.stderr
    assert f"run directory {run_dir} is being trained by another process" in busy.stderr
    assert list(run_dir.iterdir()) == []  # no error.json in another process's run
    (tmp_path / "file").write_text("mine\n")
    assert main(["train", empty_yaml, *TINY, "--run-dir", str(tmp_path / "file")]) == 2
    assert (tmp_path / "file").read_text() == "mine\n"


def test_time_train_step_times_the_runs_own_step_without_reading_its_corpus(cache_dir):
    from jaxformer.train.throughput import time_train_step

    config = load_config(None, TINY + ["data.corpus=files:no/such/*.txt", f"train.compilation_cache={cache_dir}"])
    timing = time_train_step(config, steps=2)
    assert timing.compile_s > 0 and 0 < timing.step_s < timing.compile_s
    assert timing.tokens_per_s == pytest.approx(16 * 64 / timing.step_s)


def test_each_rows_train_loss_and_grad_norm_are_means_over_its_window_of_steps(tmp_path, cache_dir):
    """Logging every step or every other step trains alike; each row of the second is the mean of two of the first."""
    base = TINY + ["train.tokens=4096", "train.eval_interval=100", f"train.compilation_cache={cache_dir}"]
    for k in (1, 2):
        train(load_config(None, base + [f"logging.interval={k}"]), tmp_path / f"every-{k}")
    every, other = _rows(tmp_path / "every-1"), _rows(tmp_path / "every-2")
    assert [row["step"] for row in every] == [1, 2, 3, 4] and [row["step"] for row in other] == [2, 4]
    for row in other:
        pair = every[row["step"] - 2:row["step"]]
        for key in ("train_loss", "grad_norm"):
            assert row[key] == pytest.approx((pair[0][key] + pair[1][key]) / 2, rel=1e-6), key


def test_a_bpe_runs_bits_per_byte_are_over_the_bytes_of_the_tokens_its_validation_scored(tmp_path, monkeypatch,
                                                                                          cache_dir):
    """A loss is a mean over the validation windows scored, whose text need not compress as the split does: the
    run's bits per byte divide by the bytes of exactly those tokens (here 11% fewer tokens per byte than the split)."""
    from jaxformer.train.dataset import prepare_dataset
    from jaxformer.train.loader import eval_batches

    monkeypatch.chdir(tmp_path)
    for i in range(10):
        (tmp_path / f"f{i:02d}.txt").write_text("".join(f"line {j * (i + 3)}: the fox and {i * j % 97} dogs\n"
                                                        for j in range(60)))
    config = load_config(None, ["data.corpus=files:*.txt", "data.tokenizer=bpe", "data.bpe_vocab_size=300",
                                "model.vocab_size=300", "model.d_model=32", "model.num_layers=1", "model.num_heads=2",
                                "data.val_fraction=0.2", "train.batch_size=4", "train.seq_len=16", "train.tokens=256",
                                "train.eval_tokens=64", f"train.compilation_cache={cache_dir}"])
    record = train(config, tmp_path / "run")
    dataset = prepare_dataset(config)
    targets = eval_batches(dataset.val, 16, 4, 64)[..., 1:]
    assert targets.size == 64
    scored_per_byte = targets.size / dataset.tokenizer.token_bytes()[targets].sum()
    assert record["val_bits_per_byte"] == pytest.approx(record["val_loss"] / math.log(2) * scored_per_byte, rel=1e-9)
    assert abs(scored_per_byte / dataset.tokens_per_byte - 1) > 0.01  # the windows scored are not the split's ratio


def test_update_k_trains_with_the_schedules_rate_k(tmp_path, cache_dir):
    """Two runs whose schedules share their first rate and end apart: their states after step 1 are the same bits
    (update 0 took the schedule's rate 0, not another update's), and after the last step they differ."""
    from jaxformer.train.optimizer import learning_rates

    settings = TINY + ["train.tokens=4096", "optimizer.warmup_fraction=0.25", "checkpoint.interval=1",
                       "checkpoint.keep=4", "checkpoint.max_overhead=1e9", f"train.compilation_cache={cache_dir}"]
    configs = [load_config(None, settings + [f"optimizer.final_lr_fraction={fraction}"]) for fraction in (0.1, 0.5)]
    rates = [learning_rates(config.optimizer, config.total_steps) for config in configs]
    assert rates[0][0] == rates[1][0] and rates[0][-1] != rates[1][-1] and len(rates[0]) == 4
    for config, name in zip(configs, "ab"):
        train(config, tmp_path / name)
    digests = [[_digest(tmp_path / name, step) for step in (1, 4)] for name in "ab"]
    assert digests[0][0] == digests[1][0] and digests[0][1] != digests[1][1]
