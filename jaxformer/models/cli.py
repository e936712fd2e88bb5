"""`jaxformer generate`: sample text from a run directory, a config file or a preset (byte-level prompts).

Where the model comes from:

- ``--preset NAME`` or ``CONFIG.yaml`` (a ``model:`` section or a bare model mapping):
  an untrained model initialised from ``--seed`` — useful to exercise the decoding path;
- ``RUN_DIR`` (a training run): ``RUN_DIR/config.yaml`` gives the model; trained
  parameters come from ``RUN_DIR/checkpoints/`` through :func:`restore_run_params`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxformer.accounting.cli import resolve_model
from jaxformer.configs import load_yaml
from jaxformer.models.config import ModelConfig
from jaxformer.models.presets import model_config_from_dict


def encode_text(text: str) -> list[int]:
    """Byte-level tokens: the UTF-8 bytes of ``text`` (vocabulary 256)."""
    return list(text.encode("utf-8"))


def decode_tokens(ids) -> str:
    """Inverse of :func:`encode_text`; ids past the byte range (a larger vocabulary) print as ``<id>``."""
    out, pending = [], bytearray()
    for token in (int(i) for i in ids):
        if token < 256:
            pending.append(token)
            continue
        out.append(pending.decode("utf-8", errors="replace") + f"<{token}>")
        pending = bytearray()
    return "".join(out) + pending.decode("utf-8", errors="replace")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a training run directory, or a YAML file with a model section")
    parser.add_argument("--preset", help="an untrained preset instead, e.g. tiny, gpt2")
    parser.add_argument("--prompt", required=True, help="text to continue (its UTF-8 bytes are the tokens)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, help="sample from the nucleus of probability mass p, in (0, 1]")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (and init seed of an untrained model)")


def run_config(run_dir: Path) -> ModelConfig:
    """The model section of ``RUN_DIR/config.yaml`` (the resolved training config)."""
    data = load_yaml(run_dir / "config.yaml")
    if not isinstance(data.get("model"), dict):
        raise ValueError(f"{run_dir / 'config.yaml'} has no model section")
    return model_config_from_dict(data["model"])


def restore_run_params(run_dir: Path, graphdef, params):
    """Trained parameters of the run at ``run_dir`` (its newest readable checkpoint), or ``params`` when it has none.

    The abstract training state (parameters and optimizer state) is rebuilt from the
    run's own ``config.yaml`` so Orbax restores exactly what training saved.
    """
    import jax

    from jaxformer.train.checkpoint import Checkpointer
    from jaxformer.train.config import load_config
    from jaxformer.train.optimizer import make_optimizer
    from jaxformer.train.step import build_state

    checkpoints = run_dir / "checkpoints"
    if not (checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())):
        print(f"note: {run_dir} has no checkpoint yet; sampling from the untrained model", file=sys.stderr)
        return params
    config = load_config(run_dir / "config.yaml")
    _, abstract = jax.eval_shape(lambda: build_state(config.model, config.train.seed, make_optimizer(config.optimizer)))
    step, state, _ = Checkpointer(checkpoints, config.checkpoint.keep).restore_latest(abstract)
    print(f"restored {run_dir} at step {step}", file=sys.stderr)
    return state["params"]


def load_model(source: str | None, preset: str | None, seed: int):
    """The model to sample from: a run directory's, a config file's or a preset's (see the module docstring)."""
    from flax import nnx

    from jaxformer.models.build import build_model

    path = None if source is None else Path(source)
    if path is not None and path.is_dir():
        if preset is not None:
            raise ValueError("give a run directory or --preset, not both")
        cfg = run_config(path)
    else:
        cfg = resolve_model(source, preset)
    model = build_model(cfg, rngs=nnx.Rngs(params=seed))
    if path is not None and path.is_dir():
        graphdef, params = nnx.split(model)
        model = nnx.merge(graphdef, restore_run_params(path, graphdef, params))
    return model


def run(args: argparse.Namespace) -> int:
    from jaxformer.models.generate import check_sampling, generate

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    if not args.prompt:
        raise ValueError("--prompt must not be empty")
    cfg = resolve_model(None, args.preset) if args.preset and args.source is None else None
    if cfg is not None:  # fail on bad sampling options before building a large preset
        check_sampling(args.temperature, args.top_k, args.top_p, cfg.vocab_size)
    model = load_model(args.source, args.preset, args.seed)
    new_tokens = generate(model, encode_text(args.prompt), max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    print(args.prompt + decode_tokens(new_tokens))
    return 0
