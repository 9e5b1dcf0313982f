"""The Llama-architecture model that `dhsa run` executes, in PyTorch.

Exactly the runner's forward (src/model/session.c, arch "llama"): token
embedding; per layer RMSNorm -> Q/K/V (no bias) -> RoPE on adjacent pairs
(x[2i], x[2i+1]) with inv_freq[i] = base^(-2i/head_dim) -> causal GQA
attention scaled by 1/sqrt(head_dim) -> output projection -> residual;
RMSNorm -> SwiGLU (silu(gate) * up) -> down -> residual; final RMSNorm and
an untied output matrix. Because RoPE here already uses the GGUF llama
pair order, export needs no Q/K permutation.
"""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 2048
    dim: int = 256
    n_layer: int = 4
    n_head: int = 8
    n_kv_head: int = 2
    head_dim: int = 64
    ffn: int = 768
    rope_base: float = 500000.0
    eps: float = 1e-5
    ctx: int = 32768  # the context the file advertises (trained to 8K)

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * r).type_as(x) * self.weight.type_as(x)


def rope_tables(cfg, T, pos0=0, device=None):
    """cos, sin: [T, head_dim/2] in float32 (angles computed in float64 as the runner does)."""
    half = cfg.head_dim // 2
    i = torch.arange(half, dtype=torch.float64)
    inv = cfg.rope_base ** (-2.0 * i / cfg.head_dim)
    ang = torch.arange(pos0, pos0 + T, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float().to(device), torch.sin(ang).float().to(device)


def apply_rope(x, cos, sin):
    # x: [B, H, T, hd]; pairs (2i, 2i+1) rotated by angle i
    B, H, T, D = x.shape
    xp = x.view(B, H, T, D // 2, 2)
    a, b = xp[..., 0], xp[..., 1]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).view(B, H, T, D)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.attn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.wq = nn.Linear(cfg.dim, cfg.n_head * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_head * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_head * hd, bias=False)
        self.wo = nn.Linear(cfg.n_head * hd, cfg.dim, bias=False)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.w_gate = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w_down = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        cfg = self.cfg
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, cfg.n_head, cfg.head_dim).transpose(1, 2)
        k = self.wk(h).view(B, T, cfg.n_kv_head, cfg.head_dim).transpose(1, 2)
        v = self.wv(h).view(B, T, cfg.n_kv_head, cfg.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                           scale=1.0 / math.sqrt(cfg.head_dim))
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, cfg.n_head * cfg.head_dim))
        h = self.ffn_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_embd = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        std = 0.02
        for n, p in self.named_parameters():
            if p.dim() == 2:
                s = std / math.sqrt(2 * self.cfg.n_layer) if n.endswith(("wo.weight", "w_down.weight")) else std
                nn.init.normal_(p, 0.0, s)

    def forward(self, ids):
        T = ids.shape[1]
        cos, sin = rope_tables(self.cfg, T, device=ids.device)
        x = self.tok_embd(ids)
        for L in self.layers:
            x = L(x, cos, sin)
        return self.output(self.norm(x))

    def n_params(self):
        return sum(p.numel() for p in self.parameters())
