"""Hugging Face checkpoints in and out: GPT-2, Llama/Mistral/Qwen2, BERT (MiniLM), Marian, T5; GGUF files.

``cfg, params = jaxformer.hf.load(path)`` reads a local ``transformers`` directory, a ``.gguf``
file or an ``import-hf`` directory; ``apply(init_params(cfg, 0)[0], params, tokens)`` runs it.
``jaxformer.hf.save(cfg, params, out)`` writes a directory that ``transformers`` loads. The
layout changes between the two (RoPE's rotate-half permutation, fused QKV, transposed linear
weights) live in `jaxformer.hf.layout`; each family's mapping in `jaxformer.hf.families`.

This package sits above `jaxformer.models`; only the commands import it.
"""

from jaxformer.hf.convert import (Checkpoint, copy_token_metadata, kept_token_metadata, load, read_checkpoint,
                                  read_config, read_token_metadata, save, write_imported)
from jaxformer.hf.metadata import read_generation_config

__all__ = ["Checkpoint", "copy_token_metadata", "kept_token_metadata", "load", "read_checkpoint", "read_config",
           "read_generation_config", "read_token_metadata", "save", "write_imported"]
