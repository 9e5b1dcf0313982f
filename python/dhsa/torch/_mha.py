"""_mha.py: dhsa.torch.MultiheadAttention, a drop-in for
torch.nn.MultiheadAttention whose attention runs on dhsa's tiled kernel,
and replace_multihead_attention(model).

Contract (docs/torch.md, "MultiheadAttention"):
  - A subclass of nn.MultiheadAttention: the same constructor, parameters,
    state_dict keys and isinstance(); from_module(mha) shares mha's
    parameters (no copy).
  - forward(query, key, value, key_padding_mask=None, need_weights=True,
    attn_mask=None, average_attn_weights=True, is_causal=False) with
    PyTorch's shapes, mask conventions (key_padding_mask bool True = ignore;
    attn_mask bool True = NOT allowed, [L, S] or [B*H, L, S]; float masks
    added), batch_first, unbatched inputs, add_bias_kv, add_zero_attn,
    kdim/vdim, and return values. Memory: the projections (linear in L)
    and dhsa's fixed workspace; never [B, H, L, S] unless need_weights
    asks for the weights, which are L x S by definition (computed one head
    at a time from dhsa's log-sum-exp).
  - Back ends: backend=None (the default) runs dhsa's C kernels on CPU
    tensors and PyTorch's SDPA (masks in its convention, per key as
    [B, 1, 1, S]) on any other device; "c" / "torch" force one.
  - Refused, with a sentence: attention dropout in training mode; backward
    through the C kernels (forward-only); backend="c" with non-CPU tensors.
Tested by python/tests/test_torch_mha.py.
"""

import math

import torch
import torch.nn.functional as F

from ._ops import _needs_graph, attention, pick_backend


def _leave_fused_paths(module, args):
    """A forward pre-hook that does nothing. nn.TransformerEncoderLayer's
    fused fast path reads self_attn's weights and never calls
    self_attn.forward; it is skipped when any submodule has a hook
    (torch/nn/modules/transformer.py), so this hook makes the layer call
    the dhsa forward."""
    return None


class MultiheadAttention(torch.nn.MultiheadAttention):
    """torch.nn.MultiheadAttention with dhsa's attention (CPU, inference).

    Same arguments as nn.MultiheadAttention(embed_dim, num_heads,
    dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
    kdim=None, vdim=None, batch_first=False, device=None, dtype=None);
    dropout > 0 is accepted and refused at a forward in training mode.
    from_module(mha) wraps an existing module's parameters."""

    def __init__(self, *args, backend=None, **kwargs):
        super().__init__(*args, **kwargs)
        pick_backend(backend)  # checks the name
        self.backend = backend
        self.register_forward_pre_hook(_leave_fused_paths)

    @classmethod
    def from_module(cls, mha, backend=None):
        """A dhsa MultiheadAttention sharing mha's parameters (and its
        out_proj module) and training flag: no weight is copied, and a
        change to one is seen by the other."""
        if not isinstance(mha, torch.nn.MultiheadAttention):
            raise TypeError("from_module takes a torch.nn.MultiheadAttention, not %s"
                            % type(mha).__name__)
        new = cls(mha.embed_dim, mha.num_heads, dropout=mha.dropout,
                  bias=mha.in_proj_bias is not None, add_bias_kv=mha.bias_k is not None,
                  add_zero_attn=mha.add_zero_attn, kdim=mha.kdim, vdim=mha.vdim,
                  batch_first=mha.batch_first, device="meta", backend=backend)
        for name in list(new._parameters):
            new._parameters[name] = mha._parameters[name]
        new.out_proj = mha.out_proj
        new.train(mha.training)
        return new

    # ------------------------------------------------------------ forward ---

    def _project(self, query, key, value):
        """q [B, L, E], k [B, S, E], v [B, S, E] (batch first)."""
        E = self.embed_dim
        b = self.in_proj_bias
        if self._qkv_same_embed_dim and query is key and key is value:
            qkv = F.linear(query, self.in_proj_weight, b)  # [B, L, 3E]
            return qkv[..., :E], qkv[..., E:2 * E], qkv[..., 2 * E:]
        bq, bk, bv = b.chunk(3) if b is not None else (None, None, None)
        if self._qkv_same_embed_dim:
            wq, wk, wv = self.in_proj_weight.chunk(3)
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        """As nn.MultiheadAttention.forward: returns (attn_output,
        attn_weights or None). attn_output is [L, B, E] ([B, L, E] with
        batch_first, [L, E] unbatched); the weights [B, L, S] averaged over
        heads, or [B, H, L, S], when need_weights. A query with no allowed
        key gets a zero attention output (PyTorch: NaN) and NaN weights (as
        PyTorch)."""
        if self.training and self.dropout > 0:
            raise RuntimeError("dhsa.torch.MultiheadAttention: attention dropout (dropout=%g) in "
                               "training mode is not supported by dhsa's kernels: call .eval() "
                               "for inference" % self.dropout)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint (as "
                               "nn.MultiheadAttention): is_causal=True promises that attn_mask "
                               "is the causal mask; dhsa then applies causality without reading it")
        batched = query.dim() == 3
        if not batched:
            if query.dim() != 2:
                raise ValueError("query must be [L, E] (unbatched) or 3-D, got shape %s"
                                 % (tuple(query.shape),))
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:  # [L, B, E] -> [B, L, E] views
            same_kv = key is value
            same_q = query is key
            query = query.transpose(0, 1)
            key = query if same_q else key.transpose(0, 1)
            value = key if same_kv else value.transpose(0, 1)
        B, L, E = query.shape
        H = self.num_heads
        d = E // H
        if key.shape[0] != B or value.shape[:2] != key.shape[:2]:
            raise ValueError("key %s and value %s do not match query %s in batch and length"
                             % (tuple(key.shape), tuple(value.shape), tuple(query.shape)))
        q, k, v = self._project(query, key, value)  # [B, L, E], [B, S, E], [B, S, E]
        kpm = key_padding_mask
        am = attn_mask
        if am is not None:
            S0 = k.shape[1]
            if am.dim() == 2 and tuple(am.shape) != (L, S0):
                raise RuntimeError("The shape of the 2D attn_mask is %s, but should be %s."
                                   % (tuple(am.shape), (L, S0)))
            if am.dim() == 3 and tuple(am.shape) != (B * H, L, S0):
                raise RuntimeError("The shape of the 3D attn_mask is %s, but should be %s."
                                   % (tuple(am.shape), (B * H, L, S0)))
            if am.dim() not in (2, 3):
                raise RuntimeError("attn_mask's dimension %d is not supported" % am.dim())
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.reshape(1, 1, E).expand(B, 1, E)], dim=1)
            v = torch.cat([v, self.bias_v.reshape(1, 1, E).expand(B, 1, E)], dim=1)
            kpm, am = _pad_masks(kpm, am)
        q4 = q.unflatten(-1, (H, d))  # [B, L, H, d] views (BLHD)
        k4 = k.unflatten(-1, (H, d))  # [B, S, H, d]
        v4 = v.unflatten(-1, (H, d))
        if self.add_zero_attn:
            z = torch.zeros(B, 1, H, d, dtype=k4.dtype, device=k4.device)
            k4, v4 = torch.cat([k4, z], dim=1), torch.cat([v4, z], dim=1)
            kpm, am = _pad_masks(kpm, am)
        S = k4.shape[1]
        if kpm is not None and tuple(kpm.shape) != (B, S):
            raise RuntimeError("key_padding_mask must be [B, S] = [%d, %d], got %s"
                               % (B, S, tuple(kpm.shape)))
        dense = None
        if am is not None and not is_causal:
            if am.dtype == torch.bool:  # True = NOT allowed: one float 0 / -inf copy
                am = torch.zeros(am.shape, dtype=torch.float32,
                                 device=am.device).masked_fill_(am, float("-inf"))
            dense = am if am.dim() == 2 else am.view(B, H, L, S)
        o = attention(q4, k4, v4, backend=self.backend, layout="BLHD", causal=bool(is_causal),
                      key_padding_mask=kpm, attn_mask=dense, return_lse=need_weights)
        lse = None
        if need_weights:
            o, lse = o
        out = o.reshape(B, L, E)  # merge heads: a view of the new [B, L, H, d]
        if batched and not self.batch_first:
            out = out.transpose(0, 1)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias)
        if not batched:
            out = out.squeeze(0)
        if not need_weights:
            return out, None
        args = (q4, k4, lse, kpm, dense, bool(is_causal), average_attn_weights)
        w = _WeightsForwardOnly.apply(*args) if _needs_graph(q4, k4) else _weights(*args)
        return out, (w if batched else w.squeeze(0))


def _pad_masks(kpm, am):
    """The masks with one more key that takes part (add_bias_kv, add_zero_attn)."""
    if kpm is not None:
        kpm = torch.cat([kpm, torch.zeros(kpm.shape[:-1] + (1,), dtype=kpm.dtype,
                                          device=kpm.device)], dim=-1)
    if am is not None:
        am = torch.cat([am, torch.zeros(am.shape[:-1] + (1,), dtype=am.dtype,
                                        device=am.device)], dim=-1)
    return kpm, am


def _weights(q4, k4, lse, kpm, dense, causal, average):
    """Attention weights from dhsa's log-sum-exp, one head at a time:
    exp(scale q.k + masks - lse). [B, L, S] averaged, else [B, H, L, S]."""
    B, L, H, d = q4.shape
    S = k4.shape[1]
    scale = 1.0 / math.sqrt(d)
    dev = q4.device
    add = torch.zeros(B, 1, S, dtype=torch.float32, device=dev)
    if kpm is not None:
        add = add + (torch.zeros(kpm.shape, device=dev).masked_fill_(kpm, float("-inf"))
                     if kpm.dtype == torch.bool else kpm.float()).reshape(B, 1, S)
    if causal:
        cm = torch.ones(L, S, dtype=torch.bool, device=dev).triu_(1)
    out = torch.zeros((B, L, S) if average else (B, H, L, S), dtype=q4.dtype, device=dev)
    for h in range(H):
        s = torch.matmul(q4[:, :, h].float(), k4[:, :, h].float().transpose(1, 2)) * scale
        s = s + add
        if dense is not None:
            s = s + (dense if dense.dim() == 2 else dense[:, h]).float()
        if causal:
            s = s.masked_fill(cm, float("-inf"))
        w = torch.exp(s - lse[:, h, :, None].to(dev))
        if average:
            out += w.to(out.dtype)
        else:
            out[:, h] = w
    if average:
        out /= H
    return out


class _WeightsForwardOnly(torch.autograd.Function):
    """The weights inside an autograd graph: they divide by dhsa's
    log-sum-exp, which has no gradient here, so backward refuses rather
    than give a wrong one."""

    @staticmethod
    def forward(ctx, *args):
        return _weights(*args)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("dhsa.torch: the attention weights come from dhsa's forward-only "
                           "kernel (no backward): train with PyTorch's attention")


def replace_multihead_attention(model, backend=None):
    """Swaps every torch.nn.MultiheadAttention inside model (not model
    itself: use MultiheadAttention.from_module) for a dhsa
    MultiheadAttention sharing its parameters, in place, and turns off
    nn.TransformerEncoder's nested-tensor path (use_nested_tensor = False)
    so that the layers receive padded tensors and a key_padding_mask.
    backend: None (dhsa's C kernels for CPU tensors, PyTorch's SDPA for
    tensors on other devices), "c" or "torch" (docs/torch.md, "Back ends").
    Returns the dotted paths replaced."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError("replace_multihead_attention takes a torch.nn.Module, not %s"
                        % type(model).__name__)
    if isinstance(model, torch.nn.MultiheadAttention):
        raise TypeError("model is itself a MultiheadAttention, which cannot be replaced in place: "
                        "use dhsa.torch.MultiheadAttention.from_module(model)")
    done = []
    for path, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.MultiheadAttention) and \
                    not isinstance(child, MultiheadAttention):
                setattr(parent, name, MultiheadAttention.from_module(child, backend=backend))
                done.append(path + "." + name if path else name)
    for m in model.modules():
        if isinstance(m, torch.nn.TransformerEncoder):
            m.use_nested_tensor = False
    return done
