"""`build_model`: the family ``cfg.family`` as a Flax NNX module."""

from __future__ import annotations

from flax import nnx

from jaxformer.architecture import ModelConfig
from jaxformer.functional.kernel import KernelConfig
from jaxformer.models.decoder import DecoderLM
from jaxformer.models.encoder import EncoderMLM
from jaxformer.models.encoder_decoder import EncoderDecoder

FAMILIES: dict[str, type[nnx.Module]] = {"decoder": DecoderLM, "encoder": EncoderMLM, "encoder_decoder": EncoderDecoder}


def build_model(cfg: ModelConfig, *, rngs: nnx.Rngs, kernel: KernelConfig = KernelConfig()) -> nnx.Module:
    """Decoder and encoder: ``logits_BTV, aux_loss = model(tokens_BT)``; encoder–decoder:
    ``model(source_BS, target_BT)``. Logits are float32; ``aux_loss`` is the MoE
    load-balancing loss summed over layers and weighted by ``cfg.router_aux_loss_weight``.
    MoE layers drop assignments past ``cfg.capacity_factor`` only when called with
    ``drop_tokens=True`` (the training objective); otherwise every assignment is served.
    """
    if cfg.family not in FAMILIES:
        raise ValueError(f"model.family must be one of {', '.join(FAMILIES)}, got {cfg.family!r}")
    return FAMILIES[cfg.family](cfg, rngs=rngs, kernel=kernel)
