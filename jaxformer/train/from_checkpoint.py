"""Training from a checkpoint (``model.init_from``: a Hugging Face directory, a ``.gguf`` file or an
``import-hf`` directory): its parameters in place of a fresh initialisation, its ``tokenizer.json``
in place of a new BPE, and what its tokens mean (special token ids, chat template) kept in the run.

`jaxformer.hf` is imported only when a run starts from a checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import jax

from jaxformer.train.config import TrainConfig


def keep_token_metadata(config: TrainConfig, run_dir: Path) -> None:
    """For a run with the checkpoint's tokenizer (`checkpoint_tokenizer`, which checked them): ``run_dir/hf.json``
    and ``run_dir/tokenizer_config.json`` of the checkpoint, so that the run's export and its samples end at the
    checkpoint's EOS, with its chat template."""
    if config.model.init_from:
        from jaxformer.hf import copy_token_metadata

        copy_token_metadata(config.model.init_from, run_dir)


def checkpoint_tokenizer(config: TrainConfig) -> Path | None:
    """With ``model.init_from`` and ``data.tokenizer=bpe``, the checkpoint's own ``tokenizer.json`` (not a new BPE)."""
    if not config.model.init_from or config.data.tokenizer != "bpe":
        return None
    path = Path(config.model.init_from) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"model.init_from={config.model.init_from} has no tokenizer.json for "
                                "data.tokenizer=bpe (a GGUF file: bring it in with jaxformer import-hf first)")
    if config.model.vocab_size > 65_536:
        raise ValueError(f"model.init_from: a vocabulary of {config.model.vocab_size:,} is past the 65,536 token ids "
                         "a BPE corpus is stored with; tokenize it to a tokens:PATH corpus instead")
    from jaxformer.train.tokenizer import BPETokenizer

    if (size := BPETokenizer.load(path).vocab_size) > config.model.vocab_size:
        raise ValueError(f"model.init_from: its tokenizer.json has {size:,} tokens, more than "
                         f"model.vocab_size={config.model.vocab_size:,}")
    from jaxformer.hf import read_token_metadata

    read_token_metadata(config.model.init_from)  # what `keep_token_metadata` copies, checked before any write
    return path


def checkpoint_params(model, abstract_params):
    """The parameters of ``model.init_from`` (fine-tuning), placed like the fresh ones they replace.

    AdamW's initial moments are zeros whatever the parameters, so swapping the parameters of a fresh
    state is starting from the checkpoint.
    """
    from jaxformer.hf import load
    from jaxformer.hf.convert import flat_params, params_from_flat

    # into this run's model (the checkpoint's architecture with the run's overrides): names and shapes checked
    params = params_from_flat(model, flat_params(load(model.init_from)[1]), source=model.init_from)
    return jax.tree.map(lambda value, like: jax.device_put(value, like.sharding), params, abstract_params)
