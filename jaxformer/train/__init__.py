"""Training: configs, tokenizers, corpora, the loader, AdamW on a budget-sized schedule, Orbax checkpoints, the loop.

``jaxformer train CONFIG.yaml [key=value ...]`` (`jaxformer.commands.train`) runs `jaxformer.train.loop.train`;
the config tree is `jaxformer.train.config.TrainConfig`. Submodules import JAX, Optax and
Orbax, so this package imports nothing eagerly.
"""
