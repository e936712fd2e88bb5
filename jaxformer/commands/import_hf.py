"""`jaxformer import-hf SRC --out DIR`: a Hugging Face checkpoint (or GGUF file) as a jaxformer model directory.

SRC is a local ``transformers`` directory (``config.json`` + ``model.safetensors`` or
``pytorch_model.bin``, sharded or not) or a ``.gguf`` file. DIR receives ``model.yaml`` (a
``model:`` section: ``jaxformer count DIR/model.yaml`` counts it), ``params.safetensors``,
``hf.json`` (the source's config) and ``tokenizer.json``; ``generate --hf DIR``,
``export-hf DIR`` and ``train model.init_from=DIR`` read it. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a transformers model directory or a .gguf file")
    parser.add_argument("--out", required=True, help="the jaxformer model directory to write")


def run(args: argparse.Namespace) -> int:
    import jax

    from jaxformer.accounting import count_params
    from jaxformer.hf import read_checkpoint, write_imported

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty")
    checkpoint = read_checkpoint(args.source)
    held = sum(leaf.size for leaf in jax.tree.leaves(checkpoint.params))
    counted = count_params(checkpoint.cfg).total
    if held != counted:  # the importer filled exactly the model's parameters; the accounting must agree
        raise RuntimeError(f"imported {held:,} parameters but the accounting counts {counted:,}")
    write_imported(checkpoint, out)
    cfg = checkpoint.cfg
    print(f"imported {checkpoint.hf_config.get('model_type')} ({cfg.family}, {cfg.num_layers} layers, "
          f"d_model {cfg.d_model}): {counted:,} parameters -> {out}"
          + ("" if checkpoint.tokenizer_json else " (no tokenizer.json)"))
    return 0
