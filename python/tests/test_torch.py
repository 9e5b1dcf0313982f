"""test_torch.py: dhsa against PyTorch itself, where PyTorch is importable
(skipped otherwise; CI does not install it). Checks that the conventions by
name really are PyTorch's: F.scaled_dot_product_attention with bool / float
attn_mask, is_causal, scale, GQA; nn.MultiheadAttention (eval +
inference_mode, its fast path) with bool and float key_padding_mask, against
a project-written forward that calls dhsa; and the example's forward at
E = 1024.
"""

import importlib.util

import numpy as np
import pytest

import dhsa
from conftest import REPO

try:
    import torch
except Exception as e:  # not installed, or installed but broken (missing libraries)
    pytest.skip("PyTorch is not importable: %s" % e, allow_module_level=True)
F = torch.nn.functional

TOL = dict(atol=3e-5, rtol=1e-4)


def t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


@pytest.fixture
def data(qkv):
    return qkv(B=2, Hq=4, Hkv=4, Lq=33, Lk=47, d=16)


def test_sdpa_no_mask_scale_and_causal(data, close):
    q, k, v = data
    with torch.inference_mode():
        close(dhsa.attention(q, k, v), F.scaled_dot_product_attention(t(q), t(k), t(v)).numpy(),
              **TOL)
        close(dhsa.attention(q, k, v, scale=0.3),
              F.scaled_dot_product_attention(t(q), t(k), t(v), scale=0.3).numpy(), **TOL)
        kk, vv = k[:, :, :33], v[:, :, :33]  # is_causal: top-left aligned, as dhsa at q_pos0 = 0
        close(dhsa.attention(q, kk, vv, causal=True),
              F.scaled_dot_product_attention(t(q), t(kk), t(vv), is_causal=True).numpy(), **TOL)


@pytest.mark.parametrize("shape", [(33, 47), (2, 1, 33, 47), (2, 4, 33, 47), (2, 1, 1, 47)])
def test_sdpa_bool_and_float_attn_mask(data, rng, close, shape):
    q, k, v = data
    m = rng.random(shape) < 0.6
    m[..., 0] = True
    f = rng.standard_normal(shape).astype(np.float32)
    with torch.inference_mode():
        close(dhsa.attention(q, k, v, attn_mask=m),
              F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(m)).numpy(),
              what="bool %s" % (shape,), **TOL)
        close(dhsa.attention(q, k, v, attn_mask=f),
              F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(f)).numpy(),
              what="float %s" % (shape,), **TOL)


def test_sdpa_gqa(qkv, close):
    q, k, v = qkv(B=1, Hq=8, Hkv=2, Lq=20, Lk=30, d=16)
    try:
        with torch.inference_mode():
            r = F.scaled_dot_product_attention(t(q), t(k), t(v), enable_gqa=True).numpy()
    except TypeError:
        pytest.skip("this PyTorch has no enable_gqa")
    close(dhsa.attention(q, k, v), r, **TOL)


def test_sdpa_fully_masked_row(data, close):
    q, k, v = data
    m = np.ones((33, 47), dtype=bool)
    m[5] = False
    o = dhsa.attention(q, k, v, attn_mask=m)
    with torch.inference_mode():
        r = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(m)).numpy()
    assert np.all(o[:, :, 5] == 0) and not np.isnan(o).any()
    # PyTorch gives NaN or 0 there depending on version and kernel; the rest agrees.
    assert np.all(np.isnan(r[:, :, 5]) | (r[:, :, 5] == 0))
    keep = np.arange(33) != 5
    close(o[:, :, keep], r[:, :, keep], **TOL)

# ------------------------------------------------------------------ MHA ---


def mha_via_dhsa(mha, x, key_padding_mask):
    """nn.MultiheadAttention's forward (batch_first, self-attention), written
    with numpy and dhsa.attention."""
    E, H = mha.embed_dim, mha.num_heads
    W = mha.in_proj_weight.detach().numpy()
    b = mha.in_proj_bias.detach().numpy()
    B, L, _ = x.shape
    q, k, v = ((x.reshape(B * L, E) @ W[i * E:(i + 1) * E].T + b[i * E:(i + 1) * E])
               .reshape(B, L, H, E // H) for i in range(3))
    o = dhsa.attention(q, k, v, key_padding_mask=key_padding_mask, layout="BLHD")
    out = o.reshape(B * L, E) @ mha.out_proj.weight.detach().numpy().T
    return (out + mha.out_proj.bias.detach().numpy()).reshape(B, L, E)


@pytest.fixture
def mha():
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    with torch.no_grad():
        m.in_proj_bias.normal_(std=0.1)
        m.out_proj.bias.normal_(std=0.1)
    return m


def test_multihead_attention_bool_key_padding_mask(mha, rng, close):
    x = rng.standard_normal((2, 40, 64)).astype(np.float32)
    kpm = np.zeros((2, 40), dtype=bool)
    kpm[0, -7:] = True
    kpm[1, -19:] = True
    with torch.inference_mode():
        r, _ = mha(t(x), t(x), t(x), key_padding_mask=t(kpm), need_weights=False)
    got = mha_via_dhsa(mha, x, kpm)
    # Padded query rows: PyTorch's fast path may treat them specially; only
    # keys are masked here, so compare the rows of non-padding positions.
    for b in range(2):
        rows = ~kpm[b]
        close(got[b, rows], r.numpy()[b, rows], what="batch %d" % b, **TOL)
    # The opposite polarity must not match.
    with pytest.raises(AssertionError):
        close(mha_via_dhsa(mha, x, ~kpm)[0, :20], r.numpy()[0, :20], **TOL)


def test_multihead_attention_float_key_padding_mask(mha, rng, close):
    x = rng.standard_normal((2, 30, 64)).astype(np.float32)
    kpm = rng.standard_normal((2, 30)).astype(np.float32)
    kpm[:, -5:] = -np.inf
    with torch.inference_mode():
        r, _ = mha(t(x), t(x), t(x), key_padding_mask=t(kpm), need_weights=False)
    close(mha_via_dhsa(mha, x, kpm), r.numpy(), **TOL)


def test_example_forward_matches_multihead_attention(rng, close):
    spec = importlib.util.spec_from_file_location("mha_memory", REPO / "examples" / "mha_memory.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    P = 96
    mha = ex.torch_module(torch)
    W = mha.in_proj_weight.detach().numpy()
    b = mha.in_proj_bias.detach().numpy()
    E = ex.E
    w = {"W_q": W[:E], "W_k": W[E:2 * E], "W_v": W[2 * E:], "b_q": b[:E], "b_k": b[E:2 * E],
         "b_v": b[2 * E:], "W_o": mha.out_proj.weight.detach().numpy(),
         "b_o": mha.out_proj.bias.detach().numpy()}
    x = rng.standard_normal((1, P, E)).astype(np.float32)
    m = ex.padding_mask(P)
    r = ex.torch_forward(torch, mha, t(x), t(m)).numpy()
    close(ex.mha_forward_dhsa(dhsa, x, m, w), r, atol=1e-4, rtol=1e-3)
