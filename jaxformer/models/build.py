"""`build_model`: the family ``cfg.family`` as a Flax NNX module."""

from __future__ import annotations

from flax import nnx

from jaxformer.architecture import Family, ModelConfig
from jaxformer.kernel import KernelConfig
from jaxformer.models.decoder import DecoderLM
from jaxformer.models.encoder import EncoderMLM
from jaxformer.models.encoder_decoder import EncoderDecoder

# one module per `Family` (ModelConfig refuses any other family on construction)
FAMILIES: dict[Family, type[nnx.Module]] = {
    "decoder": DecoderLM, "encoder": EncoderMLM, "encoder_decoder": EncoderDecoder,
}


def build_model(cfg: ModelConfig, *, rngs: nnx.Rngs, kernel: KernelConfig = KernelConfig()) -> nnx.Module:
    """Decoder and encoder: ``logits_BTV, aux_loss = model(tokens_BT)``; encoder–decoder:
    ``model(source_BS, target_BT)``. Logits are float32; ``aux_loss`` is the MoE
    load-balancing loss summed over layers, unweighted (0.0 if dense): the training objective
    adds ``cfg.router_aux_loss_weight × aux_loss`` (`jaxformer.train.step.next_token_loss`).
    MoE layers drop assignments past ``cfg.capacity_factor`` only when called with
    ``drop_tokens=True`` (the training objective); otherwise every assignment is served.
    """
    return FAMILIES[cfg.family](cfg, rngs=rngs, kernel=kernel)
