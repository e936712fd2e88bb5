"""`jaxformer bench sweep`: the PyTorch twin trains the planned steps on jaxformer's schedule, and the bench runs."""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from jaxformer.benchmarks.torch_sweep import train_twin, twin_runs
from jaxformer.cli import main
from jaxformer.train.config import config_from_dict, config_to_dict
from jaxformer.train.optimizer import learning_rates

ROOT = Path(__file__).resolve().parents[1]


def _planned(changes: dict, name: str = "run"):
    """A stand-in for a `PlannedRun`: what `twin_runs` reads (name, steps, config)."""
    base = {"model": {"preset": "tiny", "d_model": 32, "num_layers": 1, "num_heads": 2, "max_seq_len": 32},
            "train": {"batch_size": 4, "seq_len": 16, "tokens": 4 * 16 * 7, "eval_tokens": 64},
            "optimizer": {"lr": 1e-2, "warmup_fraction": 0.3, "final_lr_fraction": 0.2},
            "logging": {"interval": 3}}
    for section, values in changes.items():
        base[section] = {**base.get(section, {}), **values}
    config = config_from_dict(base)
    return SimpleNamespace(name=name, steps=config.total_steps, config=config_to_dict(config)), config


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_torch_twin_takes_the_planned_steps_at_jaxformers_learning_rates(grad_accum):
    planned, config = _planned({"train": {"grad_accum": grad_accum}})
    (run,) = twin_runs([planned])
    tokens = np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8)
    record = train_twin(dataclasses.replace(run, record_lrs=True), tokens[:3000], tokens[3000:])
    expected = learning_rates(config.optimizer, config.total_steps)
    assert record["steps"] == record["optimizer_steps"] == config.total_steps == 7
    np.testing.assert_array_equal(np.asarray(record["learning_rates"], np.float32), expected)
    assert expected[0] > 0 and expected[-1] == pytest.approx(1e-2 * 0.2)
    assert [step for step, _ in record["losses"]] == [3, 6, 7]  # logging.interval, and the last step
    assert np.isfinite(record["val_loss"]) and record["time"]["train_s"] > 0


@pytest.mark.parametrize("changes, field", [({"model": {"position": "alibi"}}, "model.position"),
                                            ({"model": {"norm_position": "post"}}, "model.norm_position"),
                                            ({"train": {"compute_dtype": "bfloat16"}}, "train.compute_dtype")])
def test_torch_twin_refuses_what_it_does_not_cover_in_one_line(changes, field):
    planned, _ = _planned(changes, name="C1-N2")
    with pytest.raises(ValueError, match=f"run C1-N2: the PyTorch twin cannot train {field}=") as error:
        twin_runs([planned])
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_bench_sweep_times_both_sides_of_a_small_plan(tmp_path, capsys):
    spec = yaml.safe_load((ROOT / "sweeps" / "tiny.yaml").read_text())
    spec["isoflop"]["budgets"] = [1e9]  # 1 budget × 2 sizes
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["bench", "sweep", str(path), "--workers", "2", "--json", str(tmp_path / "b.json")]) == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["planned_runs"] == report["runs"] == report["jax"]["runs"] == report["torch"]["runs"] == 2
    assert report["jax_wall_s"] > 0 and report["torch_wall_s"] > 0
    assert report["ratio"] == pytest.approx(report["torch_wall_s"] / report["jax_wall_s"], rel=1e-9)
    for side in (report["jax"], report["torch"]):
        assert 0 < side["train_share_of_busy"] <= 1 and 0 < side["train_share_of_capacity"] <= 1
        assert side["flops_per_s_per_worker"] > 0 and 0 < side["utilization"] <= 1
    assert report["torch"]["flops_exact"] == pytest.approx(report["jax"]["flops_exact"])
    assert report["torch"]["steps"] == report["torch"]["optimizer_steps"]
    assert report["cpu_model"] and report["jax_version"] and report["torch_version"] and report["date"]
    assert "ratio torch wall / jaxformer wall" in capsys.readouterr().out
