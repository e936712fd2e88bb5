"""A PyTorch twin of jaxformer's decoder, for `jaxformer bench train` only (PyTorch is a peer, not a dependency).

Same architecture, shapes, initialisation and optimizer as the JAX model built from one `ModelConfig`:
pre-norm blocks, LayerNorm or RMSNorm, a ReLU, GELU (exact or tanh), SiLU or SwiGLU FFN, biases as
``use_bias`` and ``qkv_bias`` say, learned positions or RoPE (consecutive pairs, as
`jaxformer.functional.apply_rope`), GQA, tied or untied head, AdamW with weight decay on matrices only
(jaxformer's `decay_mask`) and global-norm clipping. Dense decoders only (the CPU sweeps' models): what it
cannot reproduce is refused (`jaxformer.benchmarks.twin_model.unsupported_model`).
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn import functional as TF

from jaxformer.architecture import ModelConfig
from jaxformer.benchmarks.twin_model import jaxformer_init_stds, unsupported_model

# the FFN nonlinearities `unsupported_model` lets through (`jaxformer.functional.feedforward.ACTIVATIONS`);
# swiglu's is its gate's
ACTIVATIONS = {"relu": TF.relu, "gelu": TF.gelu, "gelu_tanh": lambda x: TF.gelu(x, approximate="tanh"),
               "silu": TF.silu, "swiglu": TF.silu}


def _norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)


def _rope(x_BHTD: torch.Tensor, base: float, scale: float) -> torch.Tensor:
    T, D = x_BHTD.shape[-2], x_BHTD.shape[-1]
    frequencies = base ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
    angles_TJ = (torch.arange(T, dtype=torch.float32) * scale)[:, None] * frequencies[None]
    cos, sin = angles_TJ.cos(), angles_TJ.sin()
    even, odd = x_BHTD[..., 0::2], x_BHTD[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


class TorchBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        q_width, kv_width = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.norm1, self.norm2 = _norm(cfg), _norm(cfg)
        self.wq = nn.Linear(cfg.d_model, q_width, bias=cfg.has_qkv_bias)
        self.wk = nn.Linear(cfg.d_model, kv_width, bias=cfg.has_qkv_bias)
        self.wv = nn.Linear(cfg.d_model, kv_width, bias=cfg.has_qkv_bias)
        self.wo = nn.Linear(q_width, cfg.d_model, bias=cfg.use_bias)
        self.w_in = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.use_bias)
        self.w_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.use_bias) if cfg.is_gated else None
        self.w_out = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.use_bias)

    def forward(self, x_BTE: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = x_BTE.shape
        h = self.norm1(x_BTE)
        q = self.wq(h).view(B, T, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        k = self.wk(h).view(B, T, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.wv(h).view(B, T, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        if cfg.position == "rope":
            q, k = _rope(q, cfg.rope_base, cfg.rope_scale), _rope(k, cfg.rope_base, cfg.rope_scale)
        attended = TF.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=cfg.num_kv_heads != cfg.num_heads)
        x_BTE = x_BTE + self.wo(attended.transpose(1, 2).reshape(B, T, -1))
        h = self.norm2(x_BTE)
        hidden = self.w_in(h)
        activation = ACTIVATIONS[cfg.activation]
        hidden = activation(self.w_gate(h)) * hidden if cfg.is_gated else activation(hidden)
        return x_BTE + self.w_out(hidden)


class TorchDecoder(nn.Module):
    """``tokens [B, T] -> logits [B, T, V]``; PyTorch's default initialisation (`init_like_jaxformer` gives
    jaxformer's); ``ValueError`` on a config it cannot reproduce."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        reason = unsupported_model(cfg)
        if reason is not None:
            raise ValueError(f"the PyTorch twin cannot train {reason}")
        self.cfg = cfg
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positions = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.position == "learned" else None
        self.blocks = nn.ModuleList(TorchBlock(cfg) for _ in range(cfg.num_layers))
        self.norm = _norm(cfg)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens_BT)
        if self.positions is not None:
            x = x + self.positions(torch.arange(tokens_BT.shape[1]))
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return x @ self.tokens.weight.T if self.head is None else self.head(x)


def make_torch_step(cfg: ModelConfig, *, lr: float, betas: tuple[float, float], weight_decay: float, eps: float,
                    grad_clip: float, bf16: bool = False):
    """``step(windows_BW) -> loss``: one AdamW update of a fresh `TorchDecoder`, in eager mode.

    ``bf16``: the forward pass under ``torch.autocast("cpu", torch.bfloat16)``, PyTorch's mixed
    precision (fp32 parameters and optimizer, bf16 matmuls), the peer of ``compute_dtype: bfloat16``.
    """
    torch.manual_seed(0)
    model = TorchDecoder(cfg)
    init_like_jaxformer(model, jaxformer_init_stds(cfg))
    optimizer = adamw(model, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def step(windows_BW: torch.Tensor) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(windows_BW[:, :-1])
        loss = TF.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), windows_BW[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        return loss

    step.optimizer = optimizer
    return step


def init_like_jaxformer(model: TorchDecoder, stds: tuple[float, float]) -> None:
    """Draws ``model``'s parameters as jaxformer initialises its own (`jaxformer.nn.params`): every weight matrix
    and embedding table N(0, std²), those writing into the residual stream (``wo``, ``w_out``)
    N(0, residual_std²), biases 0, norm scales 1; ``stds = (std, residual_std)`` (`jaxformer_init_stds`)."""
    std, residual_std = stds
    residual = {id(block.wo.weight) for block in model.blocks} | {id(block.w_out.weight) for block in model.blocks}
    norms = [module for module in model.modules() if isinstance(module, (nn.LayerNorm, nn.RMSNorm))]
    norm_scales = {id(norm.weight) for norm in norms}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if id(parameter) in norm_scales:
                parameter.fill_(1.0)
            elif name.endswith("bias"):
                parameter.zero_()
            else:
                parameter.normal_(0.0, residual_std if id(parameter) in residual else std)


def adamw(model: nn.Module, *, lr: float, betas: tuple[float, float], eps: float,
          weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``model`` with ``weight_decay`` on its matrices and embedding tables only, as jaxformer's
    `decay_mask` (norm scales and biases, 1-D here, are not decayed)."""
    parameters = list(model.parameters())
    groups = [{"params": [p for p in parameters if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in parameters if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def matmul_peak(dtype: str = "float32", n: int = 1024, repeats: int = 10, budget_s: float = 2.0) -> float:
    """PyTorch's FLOP/s on the best of ``repeats`` ``[n, n] @ [n, n]`` products, the peer of `probe_matmul_peak`;
    fewer (at least one) once the timed products have taken ``budget_s`` seconds, since a dtype without a fast
    path on this CPU (bf16 without AVX-512, under a GFLOP/s) would otherwise take seconds a product."""
    a = torch.ones((n, n), dtype=getattr(torch, dtype))
    a @ a  # first call: kernel selection
    best, spent = float("inf"), 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        a @ a
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent >= budget_s:
            break
    return 2.0 * n**3 / best


def load_jax_params(model: TorchDecoder, params: dict) -> None:
    """Copies a jaxformer decoder's parameters (``nnx.to_pure_dict`` of the pure view), biases included, into
    ``model``; ``ValueError`` unless every parameter of ``model`` and every array of ``params`` was copied."""
    import jax
    import numpy as np

    cfg, copied = model.cfg, {}

    def copy(target: torch.Tensor, array, *, shape: tuple[int, ...] | None = None, transpose: bool = False) -> None:
        value = np.array(array, dtype=np.float32)
        value = value.reshape(shape) if shape is not None else value
        value = value.T if transpose else value
        if value.shape != tuple(target.shape):  # copy_ would broadcast a wrong shape
            raise ValueError(f"load_jax_params: a {value.shape} array for a {tuple(target.shape)} parameter")
        target.copy_(torch.from_numpy(np.ascontiguousarray(value)))
        copied[id(target)] = target

    def copy_linear(layer: nn.Linear, weight, bias, *, in_width: int) -> None:
        """``weight`` [in, …] (a dense kernel) into ``layer.weight`` [out, in]; ``bias`` (any shape) flattened."""
        copy(layer.weight, weight, shape=(in_width, -1), transpose=True)
        if layer.bias is not None:
            if bias is None:
                raise ValueError(f"load_jax_params: jaxformer's parameters have no bias for a {layer}")
            copy(layer.bias, bias, shape=(-1,))

    def copy_norm(norm: nn.Module, source: dict) -> None:
        copy(norm.weight, source["scale"])
        if getattr(norm, "bias", None) is not None:
            copy(norm.bias, source["bias"])

    with torch.no_grad():
        copy(model.tokens.weight, params["embedding"]["tokens"])
        if model.positions is not None:
            copy(model.positions.weight, params["embedding"]["positions"])
        for index, block in enumerate(model.blocks):
            source = params["decoder"]["blocks"][index]
            attention, ffn = source["attention"], source["feed_forward"]
            for name in ("q", "k", "v"):  # [E, heads, D] -> Linear weight [heads·D, E]
                copy_linear(getattr(block, f"w{name}"), attention[f"w{name}"], attention.get(f"b{name}"),
                            in_width=cfg.d_model)
            copy_linear(block.wo, attention["wo"], attention.get("bo"), in_width=cfg.num_heads * cfg.head_dim)
            copy_linear(block.w_in, ffn["w_in"], ffn.get("b_in"), in_width=cfg.d_model)
            copy_linear(block.w_out, ffn["w_out"], ffn.get("b_out"), in_width=cfg.d_ff)
            if block.w_gate is not None:
                copy_linear(block.w_gate, ffn["w_gate"], ffn.get("b_gate"), in_width=cfg.d_model)
            copy_norm(block.norm1, source["attention_norms"][0])
            copy_norm(block.norm2, source["feed_forward_norms"][0])
        copy_norm(model.norm, params["decoder"]["final_norm"])
        if model.head is not None:
            copy(model.head.weight, params["head"]["w"], transpose=True)
    missed = [name for name, parameter in model.named_parameters() if id(parameter) not in copied]
    arrays = len(jax.tree.leaves(params))
    if missed or arrays != len(copied):
        raise ValueError(f"load_jax_params copied {len(copied)} of jaxformer's {arrays} arrays; the twin's "
                         f"parameters not set: {', '.join(missed) or 'none'}")
