"""`jaxformer bench`'s refusals: bad input and unusable output paths in one line naming the flag, exit 2, before
anything is measured; a user's files in ``bench sweep --out`` kept; a failed sweep child named with its log; the
CPU model recorded with every benchmark's figures."""

import json
from pathlib import Path

import pytest
import yaml

from jaxformer.benchmarks.outputs import output_file
from jaxformer.cli import main
from jaxformer.train.peak import cpu_model

SPEC = {"name": "mini", "base": {"model": {"preset": "tiny"}, "data": {"corpus": "synthetic-markov",
                                                                      "markov": {"bytes": 20000}},
                                 "train": {"batch_size": 8, "seq_len": 32, "eval_tokens": 512},
                                 "logging": {"interval": 10, "tensorboard": False}},
        "shape": {"head_dim": 16, "aspect_ratio": 16}, "isoflop": {"budgets": [2e8], "params": [8e3], "flops": "6ND"},
        "hyperparameters": {"optimizer.lr": "3e-3"}}
NO_MEASURING = ["--impls", "", "--memory-impls", ""]  # bench attention: nothing to time (a quick run)


def _refused(argv: list[str], capsys) -> str:
    """The one stderr line of a command that must exit 2."""
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's refusal of an option's value
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def _spec(tmp_path: Path, **data) -> str:
    spec = {**SPEC, "base": {**SPEC["base"], "data": data or SPEC["base"]["data"]}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    return str(tmp_path / "spec.yaml")


@pytest.mark.parametrize("flag", ["--memory-start-n", "--memory-max-n", "--min-n", "--max-n", "--fit-min-n"])
def test_bench_attention_refuses_a_sequence_length_below_one(flag, tmp_path, capsys):
    """``--memory-start-n 0`` doubled 0 for ever."""
    err = _refused(["bench", "attention", "--out", str(tmp_path), *NO_MEASURING, flag, "0"], capsys)
    assert f"argument {flag}: must be an integer at least 1, got 0" in err


@pytest.mark.parametrize("argv, flag", [
    (["bench", "train", "--sizes", "16:1:32", "--batch", "2", "--steps", "1", "--repeats", "1", "--no-torch",
      "--dtypes", "float32", "--json", "{dir}"], "--json"),
    (["bench", "train", "--sizes", "16:1:32", "--batch", "2", "--steps", "1", "--repeats", "1", "--no-torch",
      "--dtypes", "float32", "--out", "{file}"], "--out"),
    (["bench", "profile", "--size", "16:1:32", "--batch", "2", "--steps", "1", "--json", "{dir}"], "--json"),
    (["bench", "together", "--sizes", "16:1:32", "--batch", "2", "--runs", "2", "--steps", "1", "--repeats", "1",
      "--json", "{dir}"], "--json"),
    (["bench", "decode", "--preset", "tiny", "--tokens", "2", "--prompt-len", "2", "--repeats", "1", "--window", "1",
      "--out", "{file}"], "--out"),
    (["bench", "attention", *NO_MEASURING, "--out", "{file}"], "--out"),
    (["bench", "fit", "--repeats", "1", "--bootstrap", "0", "--command-runs", "0", "--out", "{file}/fit.json"], "--out"),
    (["bench", "sweep", "{spec}", "--skip-torch", "--json", "{dir}"], "--json"),
    (["bench", "sweep", "{spec}", "--skip-torch", "--out", "{file}"], "--out"),
])
def test_an_unusable_output_path_is_refused_before_measuring(argv, flag, tmp_path, capsys):
    (tmp_path / "a-file").write_text("mine\n")
    (tmp_path / "a-dir").mkdir()
    names = {"{dir}": str(tmp_path / "a-dir"), "{file}": str(tmp_path / "a-file"), "{spec}": _spec(tmp_path)}
    for key, value in names.items():
        argv = [a.replace(key, value) for a in argv]
    err = _refused(argv, capsys)
    assert flag in err and "Errno" not in err
    assert (tmp_path / "a-file").read_text() == "mine\n" and not any((tmp_path / "a-dir").iterdir())


def test_an_output_files_directory_is_created(tmp_path):
    assert output_file(tmp_path / "new" / "deeper" / "fit.json", "--out") == tmp_path / "new" / "deeper" / "fit.json"
    assert (tmp_path / "new" / "deeper").is_dir() and output_file(None, "--out") is None


def test_bench_train_without_torch_is_one_line_before_measuring(monkeypatch, capsys):
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: (
        (_ for _ in ()).throw(importlib.metadata.PackageNotFoundError(name)) if name == "torch" else real(name)))
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # `import torch` fails, as without it
    err = _refused(["bench", "train", "--sizes", "16:1:32"], capsys)
    assert "needs torch installed (or pass --no-torch)" in err


def test_bench_train_layout_needs_a_size_it_compares(monkeypatch, tmp_path, capsys):
    """``--layout`` compares layouts at d_model <= 128: with none it would save a layout it never measured."""
    monkeypatch.setattr("jaxformer.benchmarks.train.LAYOUT_FILE", tmp_path / "layout.json")
    err = _refused(["bench", "train", "--sizes", "256:1:32", "--batch", "2", "--steps", "1", "--repeats", "1",
                    "--no-torch", "--dtypes", "float32", "--layout"], capsys)
    assert "--layout" in err and "256:1:32" in err and not (tmp_path / "layout.json").exists()


def test_bench_profile_names_its_own_dtype_flag(capsys):
    err = _refused(["bench", "profile", "--dtype", "float16"], capsys)
    assert "--dtype entries must be float32 or bfloat16, got 'float16'" in err and "--dtypes" not in err


def test_bench_sweep_keeps_a_users_files_in_out(tmp_path, capsys):
    """``out/r0`` holding files bench sweep did not write is refused, not emptied."""
    (tmp_path / "out" / "r0").mkdir(parents=True)
    (tmp_path / "out" / "r0" / "notes.txt").write_text("mine\n")
    err = _refused(["bench", "sweep", _spec(tmp_path), "--skip-torch", "--out", str(tmp_path / "out")], capsys)
    assert "--out" in err and "r0" in err
    assert (tmp_path / "out" / "r0" / "notes.txt").read_text() == "mine\n"


@pytest.mark.slow
def test_a_failed_sweep_child_is_one_line_naming_its_status_and_log(tmp_path, capsys):
    spec = _spec(tmp_path, corpus="files:/nonexistent/*.txt")
    code = main(["bench", "sweep", spec, "--skip-torch", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    log = tmp_path / "out" / "r0" / "jax.log"
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "jaxformer sweep exited with status 2" in err and str(log) in err and log.is_file()


def test_bench_attention_records_the_cpu_model(tmp_path, capsys):
    assert main(["bench", "attention", "--out", str(tmp_path), *NO_MEASURING]) == 0
    machine = json.loads((tmp_path / "attention.json").read_text())["machine"]
    assert machine["cpu_model"] == cpu_model() and machine["cores"] > 0 and machine["jax_version"]
    assert cpu_model() in capsys.readouterr().out


@pytest.mark.slow
def test_bench_together_records_the_cpu_model(tmp_path, capsys):
    assert main(["bench", "together", "--sizes", "16:1:32", "--batch", "2", "--runs", "2", "--steps", "1",
                 "--repeats", "1", "--json", str(tmp_path / "t.json")]) == 0
    report = json.loads((tmp_path / "t.json").read_text())
    assert report["cpu_model"] == cpu_model() and len(report["results"]) == 1
    assert cpu_model() in capsys.readouterr().out


@pytest.mark.slow
def test_bench_profile_notes_a_fused_kernel_it_could_not_load(monkeypatch, tmp_path, capsys):
    """The profile is then the plain path's, as `bench train` notes it."""
    from jaxformer.functional import fused_attention

    monkeypatch.setattr(fused_attention, "fused_available", lambda: False)
    monkeypatch.setattr(fused_attention, "unavailable_reason", lambda: "not built here")
    assert main(["bench", "profile", "--size", "16:1:32", "--batch", "2", "--steps", "1", "--attention-impl",
                 "fused", "--json", str(tmp_path / "p.json")]) == 0
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["notes"] == ["fused kernel unavailable, so jaxformer's rows time the plain path: not built here"]
    assert report["cpu_model"] == cpu_model() and "fused kernel unavailable" in capsys.readouterr().out
