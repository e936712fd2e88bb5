"""The PyTorch peer of this folder's comparison: the same model, data, schedule and initial parameters trained by the
PyTorch twin of `jaxformer bench sweep` (`jaxformer.benchmarks.torch_twin.train_twin`, one thread), in fp32 or with
its forward under bf16 autocast; the run is written as compare.py reads one (metrics.jsonl, final.json).

    python experiments/bf16_curve/torch_curves.py experiments/bf16_curve/config.yaml OUT_DIR [KEY=VALUE ...]

``train.compute_dtype=bfloat16`` among the overrides trains under autocast. The twin starts from jaxformer's own
initial parameters for the config's seed (`load_jax_params`), not from PyTorch's initialisation, so that both
frameworks' curves start from one point.
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
from flax import nnx

from jaxformer.benchmarks.replay import ReplayedRun
from jaxformer.benchmarks.torch_reference import TorchDecoder, load_jax_params
from jaxformer.benchmarks.torch_twin import prepare_data, train_twin, twin_runs
from jaxformer.models.pure import init_params
from jaxformer.train.config import config_to_dict, load_config


def main(config_path: str, out: Path, overrides: list[str]) -> None:
    torch.set_num_threads(1)
    config = load_config(config_path, overrides)
    planned = ReplayedRun("curve", config.total_steps, config_to_dict(config))
    (run,) = twin_runs([planned])
    out.mkdir(parents=True, exist_ok=True)
    start = TorchDecoder(config.model)
    load_jax_params(start, nnx.to_pure_dict(init_params(config.model, config.train.seed)[1]))
    torch.save(start.state_dict(), out / "initial.pt")
    run = dataclasses.replace(run, initial_params=str(out / "initial.pt"))
    train_tokens, val_tokens = prepare_data([planned])[run.data_key]
    record = train_twin(run, train_tokens, val_tokens)
    rows = [{"step": step, "train_loss": loss} for step, loss in record["losses"]]
    rows[-1]["val_loss"] = record["val_loss"]
    (out / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (out / "final.json").write_text(json.dumps({"time": record["time"], "autocast": run.autocast,
                                                "torch": torch.__version__}, indent=2) + "\n")
    (out / "initial.pt").unlink()
    print(json.dumps({"train_loss": record["train_loss"], "val_loss": record["val_loss"], "time": record["time"]}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])
