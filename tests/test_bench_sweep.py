"""`jaxformer bench sweep`: the PyTorch twin trains the planned steps on jaxformer's schedule, branches continue their
trunk, bf16 runs train under autocast, a twin can start from jaxformer's initial parameters, and the bench replays a
whole sweep (tuning stage, trunks, branches) on both sides."""

import dataclasses
import json
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import yaml
from flax import nnx

from jaxformer.benchmarks.replay import ReplayedRun
from jaxformer.benchmarks.torch_reference import TorchDecoder, load_jax_params, matmul_peak
from jaxformer.benchmarks.torch_twin import train_twin, twin_runs
from jaxformer.cli import main
from jaxformer.models.pure import init_params
from jaxformer.train.config import config_from_dict, config_to_dict
from jaxformer.train.loader import Loader
from jaxformer.train.optimizer import learning_rates
from jaxformer.train.step import next_token_loss

ROOT = Path(__file__).resolve().parents[1]


def _planned(changes: dict, name: str = "run", **fork):
    """A run as `twin_runs` reads it (name, steps, config; ``trunk`` and ``fork_step`` for a branch)."""
    base = {"model": {"preset": "tiny", "d_model": 32, "num_layers": 1, "num_heads": 2, "max_seq_len": 32},
            "train": {"batch_size": 4, "seq_len": 16, "tokens": 4 * 16 * 7, "eval_tokens": 64},
            "optimizer": {"lr": 1e-2, "warmup_fraction": 0.3, "final_lr_fraction": 0.2},
            "logging": {"interval": 3}}
    for section, values in changes.items():
        base[section] = {**base.get(section, {}), **values}
    config = config_from_dict(base)
    return ReplayedRun(name, config.total_steps, config_to_dict(config), **fork), config


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


def test_a_branch_continues_its_trunks_model_optimizer_and_data(tmp_path):
    """Trunk to step 4, branch from there to 10: the same run as 10 steps straight through (constant lr)."""
    constant = {"optimizer": {"schedule": "constant", "warmup_fraction": 0.0}}
    straight, config = _planned({**constant, "train": {"tokens": 4 * 16 * 10}}, name="straight")
    trunk, _ = _planned({**constant, "train": {"tokens": 4 * 16 * 4}}, name="trunk")
    branch = ReplayedRun("branch", straight.steps, straight.config, trunk="trunk", fork_step=4)
    tokens = np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8)
    with pytest.raises(ValueError, match="fork_dir"):
        twin_runs([trunk, branch])
    alone, trunk_run, branch_run = twin_runs([straight, trunk, branch], fork_dir=str(tmp_path))
    assert trunk_run.forks == (4,) and alone.forks == () and branch_run.flops_exact == pytest.approx(alone.flops_exact * 0.6)
    expected = train_twin(alone, tokens[:3000], tokens[3000:])
    train_twin(trunk_run, tokens[:3000], tokens[3000:])
    assert (tmp_path / "trunk" / "4.pt").is_file()
    record = train_twin(branch_run, tokens[:3000], tokens[3000:])
    assert record["optimizer_steps"] == expected["optimizer_steps"] == 10 and record["tokens"] == 6 * 4 * 16
    assert [step for step, _ in record["losses"]] == [6, 9, 10]
    np.testing.assert_allclose(record["losses"][-1][1], expected["losses"][-1][1], rtol=1e-5)
    np.testing.assert_allclose(record["val_loss"], expected["val_loss"], rtol=1e-5)


def test_a_bfloat16_run_trains_under_autocast_with_fp32_masters(tmp_path):
    """``train.compute_dtype: bfloat16`` is PyTorch's autocast: bf16 products move the losses off fp32's by bf16
    rounding (not by more), the parameters and AdamW's moments stay fp32."""
    tokens = np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8)
    records, states = {}, {}
    for dtype in ("float32", "bfloat16"):
        planned, _ = _planned({"train": {"compute_dtype": dtype}}, name=dtype)
        (run,) = twin_runs([planned], checkpoint_dir=str(tmp_path))
        assert run.autocast == (dtype == "bfloat16")
        records[dtype] = train_twin(run, tokens[:3000], tokens[3000:])
        states[dtype] = torch.load(tmp_path / dtype / "7.pt")
    fp32, bf16 = (np.array([loss for _, loss in records[d]["losses"]]) for d in ("float32", "bfloat16"))
    assert not np.array_equal(fp32, bf16)
    np.testing.assert_allclose(bf16, fp32, rtol=2e-3)
    tensors = [*states["bfloat16"]["model"].values(),
               *(v for moments in states["bfloat16"]["optimizer"]["state"].values() for k, v in moments.items()
                 if k != "step")]
    assert tensors and {t.dtype for t in tensors} == {torch.float32}


def test_a_twin_started_from_jaxformers_parameters_scores_jaxformers_first_loss(tmp_path):
    """``initial_params``: the twin starts from jaxformer's initial model (by default it draws its own as jaxformer
    does: the same distributions, other draws, so a first loss near jaxformer's, not PyTorch's default ~15)."""
    planned, config = _planned({"logging": {"interval": 1}})
    graphdef, params = init_params(config.model, config.train.seed)
    start = TorchDecoder(config.model)
    load_jax_params(start, nnx.to_pure_dict(params))
    torch.save(start.state_dict(), tmp_path / "initial.pt")
    tokens = np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8)
    first_batch = Loader(tokens[:3000], config.train.seq_len, config.train.batch_size, config.train.seed).next_batch()
    _, expected = next_token_loss(graphdef, params, jnp.asarray(first_batch), jnp.float32)
    (run,) = twin_runs([planned])
    ours = train_twin(dataclasses.replace(run, initial_params=str(tmp_path / "initial.pt")), tokens[:3000], tokens[3000:])
    theirs = train_twin(run, tokens[:3000], tokens[3000:])
    assert ours["losses"][0] == (1, pytest.approx(float(expected), rel=1e-5))
    assert theirs["losses"][0][1] != pytest.approx(float(expected), rel=1e-5)
    assert theirs["losses"][0][1] == pytest.approx(float(expected), abs=0.1)


@pytest.mark.parametrize("changes, field", [({"model": {"position": "alibi"}}, "model.position"),
                                            ({"model": {"norm_position": "post"}}, "model.norm_position"),
                                            ({"model": {"sliding_window": 8}}, "model.sliding_window")])
def test_torch_twin_refuses_what_it_does_not_cover_in_one_line(changes, field):
    planned, _ = _planned(changes, name="C1-N2")
    with pytest.raises(ValueError, match=f"run C1-N2: the PyTorch twin cannot train {field}=") as error:
        twin_runs([planned])
    assert "\n" not in str(error.value)


def test_the_torch_matmul_peak_stops_repeating_once_its_time_budget_is_spent():
    """A probe of a dtype without a fast path on this CPU would otherwise take seconds a product."""
    started = time.perf_counter()
    peak = matmul_peak("float32", n=128, repeats=10**6, budget_s=0.05)  # 10⁶ products unbudgeted: minutes
    assert time.perf_counter() - started < 2.0
    assert 0 < peak < 1e13  # FLOP/s of a 2·128³ product; a machine shared with other work measured 5.6e7


@pytest.mark.slow
def test_bench_sweep_replays_a_tuned_branched_sweep_on_both_sides(tmp_path, capsys):
    spec = yaml.safe_load((ROOT / "sweeps" / "tiny.yaml").read_text())
    spec.pop("hyperparameters")  # the tuning stage fits the learning-rate rule
    spec["base"]["optimizer"] = {"schedule": "wsd", "warmup_tokens": 512, "cooldown_fraction": 0.2}
    spec["tune"] = {"budget": 1e9, "params": [8e3, 16e3], "lr": [1e-3, 3e-3, 1e-2]}
    spec["branches"] = True  # 2 sizes × 2 budgets: 2 trunks, 4 branches
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["bench", "sweep", str(path), "--workers", "2", "--out", str(tmp_path / "b"),
                 "--json", str(tmp_path / "b.json")]) == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["planned_runs"] == 4 + 6  # the main plan and the tuning stage
    assert report["runs"] == report["jax"]["runs"] == report["torch"]["runs"] == 6 + 2 + 4
    assert report["jax_wall_s"] > 0 and report["torch_wall_s"] > 0 and report["schedules_s"] > 0
    assert report["ratio"] == pytest.approx(report["torch_wall_s"] / report["jax_wall_s"], rel=1e-9)
    for side in (report["jax"], report["torch"]):
        assert 0 < side["train_share_of_busy"] <= 1 and 0 < side["train_share_of_capacity"] <= 1
        assert side["flops_per_s_per_worker"] > 0 and 0 < side["utilization"] <= 1
    # the same work: a branch counts only its steps after the fork, on both sides
    assert report["torch"]["flops_exact"] == pytest.approx(report["jax"]["flops_exact"])
    assert report["torch"]["steps"] == report["torch"]["optimizer_steps"]
    twin = json.loads((tmp_path / "b" / "r0" / "torch.json").read_text())["runs"]
    branches = [run for run in twin if run["fork_step"]]
    assert len(branches) == 4 and all(run["tokens"] < run["steps"] * 8 * 32 for run in branches)
    plan = json.loads((tmp_path / "b" / "r0" / "jax" / "plan.json").read_text())
    rates = {entry["name"]: yaml.safe_load((tmp_path / "b" / "r0" / "jax" / "configs" / f"{entry['name']}.yaml")
                                           .read_text())["optimizer"]["lr"] for entry in plan["runs"]}
    with np.load(tmp_path / "b" / "r0" / "schedules.npz") as schedules:  # the twin trained at the tuned rates
        assert {name: float(schedules[name].max()) for name in rates} == pytest.approx(rates)
    assert plan["lr_rule"]["source"] == "tune/tune.json"
    assert set(report["torch"]["val_loss"]) == set(report["jax"]["val_loss"])  # the same runs, by name
    assert report["cpu_model"] and report["jax_version"] and report["torch_version"] and report["date"]
    assert report["torch"]["torch_matmul_peak_dtype"] == "float32" and not any(run["autocast"] for run in twin)
    assert "ratio torch wall / jaxformer wall" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_sweep_times_a_bfloat16_plan_against_pytorchs_autocast(tmp_path, capsys):
    spec = yaml.safe_load((ROOT / "sweeps" / "tiny.yaml").read_text())
    spec["base"]["train"]["compute_dtype"] = "bfloat16"
    path = tmp_path / "bf16.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["bench", "sweep", str(path), "--workers", "2", "--out", str(tmp_path / "b"),
                 "--json", str(tmp_path / "b.json")]) == 0
    report = json.loads((tmp_path / "b.json").read_text())
    twin = json.loads((tmp_path / "b" / "r0" / "torch.json").read_text())["runs"]
    assert report["runs"] == len(twin) == 4 and all(run["autocast"] for run in twin)
    finals = [json.loads(path.read_text()) for path in (tmp_path / "b" / "r0" / "jax").glob("runs/*/final.json")]
    assert len(finals) == 4 and {final["config"]["train"]["compute_dtype"] for final in finals} == {"bfloat16"}
    assert report["torch"]["torch_matmul_peak_dtype"] == "bfloat16" and report["torch"]["torch_matmul_peak_flops"] > 0
    assert "1-thread bfloat16 matmul peak" in capsys.readouterr().out


def test_the_summary_takes_each_sides_lower_median_repeat_and_their_ratio():
    """Each side's top-level figures are those of its repeat with the lower-median wall time (of two, the faster; of
    three, the middle one), the sides picked apart, and the ratio is torch's wall time over jaxformer's."""
    from jaxformer.benchmarks.sweep import _summarise

    def repeat(jax_s, torch_s):
        return {"jax": {"wall_s": jax_s, "runs": 12, "utilization": jax_s / 100},
                "torch": {"wall_s": torch_s, "runs": 12, "utilization": torch_s / 100}}

    for walls, (jax_s, torch_s) in (([(10.0, 30.0), (8.0, 33.0)], (8.0, 30.0)),
                                    ([(9.0, 31.0), (12.0, 29.0), (7.0, 40.0)], (9.0, 31.0)),
                                    ([(11.0, 35.0)], (11.0, 35.0))):
        report = {"repeats": [repeat(*pair) for pair in walls]}
        _summarise(report)
        assert (report["jax_wall_s"], report["torch_wall_s"], report["runs"]) == (jax_s, torch_s, 12)
        assert (report["jax"]["utilization"], report["torch"]["utilization"]) == (jax_s / 100, torch_s / 100)
        assert report["ratio"] == torch_s / jax_s
