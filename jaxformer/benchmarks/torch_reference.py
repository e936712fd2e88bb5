"""A PyTorch twin of jaxformer's decoder, for `jaxformer bench train` only (PyTorch is a peer, not a dependency).

Same architecture, shapes and optimizer as the JAX model built from one `ModelConfig`:
pre-norm blocks, LayerNorm or RMSNorm, GELU or SwiGLU FFN, learned positions or RoPE
(consecutive pairs, as `jaxformer.functional.apply_rope`), GQA, tied or untied head,
AdamW with global-norm clipping. Dense decoders only (the CPU sweeps' models).
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn import functional as TF

from jaxformer.architecture import ModelConfig


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
        self.wq = nn.Linear(cfg.d_model, q_width, bias=cfg.use_bias)
        self.wk = nn.Linear(cfg.d_model, kv_width, bias=cfg.use_bias)
        self.wv = nn.Linear(cfg.d_model, kv_width, bias=cfg.use_bias)
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
        hidden = TF.silu(self.w_gate(h)) * hidden if cfg.is_gated else (
            TF.relu(hidden) if cfg.activation == "relu" else TF.gelu(hidden))
        return x_BTE + self.w_out(hidden)


class TorchDecoder(nn.Module):
    """``tokens [B, T] -> logits [B, T, V]``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.family != "decoder" or cfg.is_moe or cfg.norm_position != "pre":
            raise ValueError("the PyTorch reference covers dense pre-norm decoders only")
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay, eps=eps)

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

    return step


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
    """Copies a jaxformer decoder's parameters (``nnx.to_pure_dict`` of the pure view) into ``model``."""
    import numpy as np

    def tensor(array, *, transpose=False) -> torch.Tensor:
        value = np.array(array, dtype=np.float32)
        return torch.from_numpy(np.ascontiguousarray(value.T if transpose else value))

    cfg = model.cfg
    with torch.no_grad():
        model.tokens.weight.copy_(tensor(params["embedding"]["tokens"]))
        if model.positions is not None:
            model.positions.weight.copy_(tensor(params["embedding"]["positions"]))
        for index, block in enumerate(model.blocks):
            source = params["decoder"]["blocks"][index]
            attention = source["attention"]
            for name in ("wq", "wk", "wv"):  # [E, heads, D] -> Linear weight [heads·D, E]
                getattr(block, name).weight.copy_(tensor(attention[name].reshape(cfg.d_model, -1), transpose=True))
            block.wo.weight.copy_(tensor(attention["wo"].reshape(-1, cfg.d_model), transpose=True))
            ffn = source["feed_forward"]
            block.w_in.weight.copy_(tensor(ffn["w_in"], transpose=True))
            block.w_out.weight.copy_(tensor(ffn["w_out"], transpose=True))
            if block.w_gate is not None:
                block.w_gate.weight.copy_(tensor(ffn["w_gate"], transpose=True))
            for norm, norms in ((block.norm1, source["attention_norms"]), (block.norm2, source["feed_forward_norms"])):
                norm.weight.copy_(tensor(norms[0]["scale"]))
        model.norm.weight.copy_(tensor(params["decoder"]["final_norm"]["scale"]))
        if model.head is not None:
            model.head.weight.copy_(tensor(params["head"]["w"], transpose=True))
