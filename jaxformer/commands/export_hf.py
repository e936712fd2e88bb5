"""`jaxformer export-hf RUN_DIR --out DIR`: a jaxformer model as a directory ``transformers`` loads.

RUN_DIR is a training run (its newest checkpoint, read-only), an ``import-hf`` directory, or a
Hugging Face directory / GGUF file (a round trip). DIR receives ``config.json``,
``model.safetensors`` (float32) and ``tokenizer.json`` (the run's BPE, the byte tokenizer, or the
imported one, with its ``tokenizer_config.json``, special token ids and ``generation_config.json`` — also for
a run trained from a checkpoint with its tokenizer); ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` (AutoModelForMaskedLM /
AutoModel for an encoder, AutoModelForSeq2SeqLM for an encoder–decoder) loads it, with the same
logits as jaxformer. A model with no Hugging Face equivalent exits 2 naming the field, before any checkpoint
is restored or read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxformer.architecture import ModelConfig
    from jaxformer.train.config import TrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a training run directory, an import-hf directory or a Hugging Face checkpoint")
    parser.add_argument("--out", required=True, help="the Hugging Face directory to write")


def _is_run(source: Path) -> bool:
    return (source / "config.yaml").is_file()


def read_model(source: Path) -> tuple[ModelConfig, TrainConfig | None]:
    """``(model, config)``: the `ModelConfig` of a run directory (its config.yaml, ``config`` the run's whole
    config) or a checkpoint (its config, ``config`` None), no parameter read."""
    if _is_run(source):
        from jaxformer.train.restore import load_run_config

        config = load_run_config(source)
        return config.model, config
    from jaxformer.hf import read_config

    return read_config(source), None


def read_source(source: Path, config: TrainConfig | None):
    """``(cfg, params, tokenizer_json, source_config, tokenizer_config, generation_config)`` of a run directory
    (``config``: its config, as `read_model` read it) or any checkpoint `jaxformer.hf` reads (``config`` None)."""
    if config is not None:
        from jaxformer.hf.tokenizer import byte_tokenizer_json
        from jaxformer.train.checkpoint import CheckpointError
        from jaxformer.train.restore import restore_params

        tokenizer_path = source / "tokenizer.json"
        if config.data.tokenizer == "bpe":  # checked before the restore, and never copied damaged
            from jaxformer.train.tokenizer import BPETokenizer

            if not tokenizer_path.is_file():
                raise FileNotFoundError(f"{source} trained with data.tokenizer=bpe but has no tokenizer.json")
            BPETokenizer.load(tokenizer_path)  # one line naming the file where the tokenizers library cannot read it
            tokenizer_json = tokenizer_path.read_text()
        elif not config.data.corpus.startswith("tokens:"):  # token ids of a .bin corpus have no tokenizer here
            tokenizer_json = byte_tokenizer_json()
        else:
            tokenizer_json = None
        try:
            restored = restore_params(source, config)
        except CheckpointError as error:
            raise ValueError(str(error)) from None
        if restored is None:
            raise ValueError(f"{source} has no checkpoint to export yet")
        print(f"restored {source} at step {restored[0]}", file=sys.stderr)
        from jaxformer.hf import kept_token_metadata, read_generation_config

        source_config, tokenizer_config = kept_token_metadata(source) or ({}, None)  # trained from a checkpoint
        return (config.model, restored[1], tokenizer_json, source_config, tokenizer_config,
                read_generation_config(source))
    from jaxformer.hf import read_checkpoint

    checkpoint = read_checkpoint(source)
    return (checkpoint.cfg, checkpoint.params, checkpoint.tokenizer_json, checkpoint.hf_config,
            checkpoint.tokenizer_config, checkpoint.generation_config)


def run(args: argparse.Namespace) -> int:
    from jaxformer.hf import save
    from jaxformer.hf.families import auto_class, for_config

    source, out = Path(args.source), Path(args.out)
    if not source.exists():
        raise FileNotFoundError(f"no run directory or checkpoint at {source}")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty")
    model, config = read_model(source)
    for_config(model).check_export(model)  # before restoring a checkpoint (minutes, and memory) only to refuse it
    cfg, params, tokenizer_json, source_config, tokenizer_config, generation_config = read_source(source, config)
    save(cfg, params, out, tokenizer_json=tokenizer_json, source_config=source_config, tokenizer_config=tokenizer_config,
         generation_config=generation_config)
    print(f"exported {cfg.family} model -> {out} (transformers.{auto_class(cfg)}.from_pretrained({str(out)!r}))")
    return 0
