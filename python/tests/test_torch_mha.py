"""test_torch_mha.py: dhsa.torch.MultiheadAttention against
torch.nn.MultiheadAttention on the same weights (eval, inference_mode: the
fast path where PyTorch has one), where PyTorch is importable (skipped,
saying why, otherwise).

Outputs within 1e-5 of PyTorch's (issue 15) over batch_first or not,
unbatched, self- and cross-attention, kdim/vdim, add_bias_kv,
add_zero_attn, bool and float key_padding_mask and attn_mask (2-D and
3-D), is_causal, need_weights averaged or per head; the same state_dict
keys; replace_multihead_attention in nn.TransformerEncoder(Layer); the
finder sees nothing square in the drop-in where it sees [B, H, P, P] in
PyTorch's; the refusals (dropout in training, backward, float64). One test
proves the comparison can fail (the opposite mask polarity).
"""

import warnings

import numpy as np
import pytest

try:
    import torch
except Exception as e:  # not installed, or installed but broken
    pytest.skip("PyTorch is not importable: %s (make test-torch makes a venv with it)" % e,
                allow_module_level=True)

import dhsa.torch as dt  # noqa: E402

TOL = dict(atol=1e-5, rtol=0.0)
E, H, L, S, B = 64, 4, 37, 29, 3


def pair(seed=0, **kw):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, H, **kw).eval()
    with torch.no_grad():  # non-zero biases, so they are checked too
        if m.in_proj_bias is not None:
            m.in_proj_bias.normal_(std=0.2)
            m.out_proj.bias.normal_(std=0.2)
        if m.bias_k is not None:
            m.bias_k.normal_()
            m.bias_v.normal_()
    return m, dt.MultiheadAttention.from_module(m)


def inputs(batch_first, self_attn, kdim=None, vdim=None, batched=True):
    def t(n, e):
        if not batched:
            return torch.randn(n, e)
        return torch.randn(B, n, e) if batch_first else torch.randn(n, B, e)
    q = t(L, E)
    if self_attn:
        return q, q, q
    return q, t(S, kdim or E), t(S, vdim or E)


def both(m, d, args, **kw):
    with torch.inference_mode():
        return m(*args, **kw), d(*args, **kw)


def same(r, g, close, what, rows=None):
    o_ref, o = r[0].numpy(), g[0].numpy()
    close(o, o_ref, what=what + " output", **TOL)
    if r[1] is None:
        assert g[1] is None, what
    else:
        close(g[1].numpy(), r[1].numpy(), what=what + " weights", **TOL)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("extra", [{}, {"add_bias_kv": True}, {"add_zero_attn": True},
                                   {"kdim": 24, "vdim": 40}, {"bias": False}])
def test_masks_and_options(batch_first, extra, close, rng):
    m, d = pair(batch_first=batch_first, **extra)
    args = inputs(batch_first, False, extra.get("kdim"), extra.get("vdim"))
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[:, -6:] = True
    kpm[1, :3] = True
    am = torch.from_numpy(rng.random((L, S)) < 0.25)
    am[:, 0] = False  # every query keeps a key
    am3 = torch.from_numpy(rng.random((B * H, L, S)) < 0.25)
    am3[..., 0] = False
    fl = torch.from_numpy(rng.standard_normal((L, S)).astype(np.float32))
    cases = {
        "none": {},
        "kpm bool": dict(key_padding_mask=kpm),
        "kpm float": dict(key_padding_mask=torch.from_numpy(
            rng.standard_normal((B, S)).astype(np.float32))),
        "attn_mask bool 2-D": dict(attn_mask=am),
        "attn_mask bool 3-D": dict(attn_mask=am3),
        "attn_mask float": dict(attn_mask=fl),
        "both, weights averaged": dict(key_padding_mask=kpm, attn_mask=am, need_weights=True),
        "both, weights per head": dict(key_padding_mask=kpm, attn_mask=fl, need_weights=True,
                                       average_attn_weights=False),
        "need_weights=False": dict(key_padding_mask=kpm, need_weights=False),
    }
    for what, kw in cases.items():
        r, g = both(m, d, args, **kw)
        same(r, g, close, "%s %s bf=%s" % (what, extra, batch_first))


@pytest.mark.parametrize("batch_first", [True, False])
def test_self_attention_fast_path(batch_first, close):
    m, d = pair(batch_first=batch_first)
    x = inputs(batch_first, True)
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[:, -7:] = True
    r, g = both(m, d, x, key_padding_mask=kpm, need_weights=False)
    assert g[0].shape == r[0].shape
    # rows of padded positions still see the unpadded keys: every row compared
    same(r, g, close, "self-attention bf=%s" % batch_first)


def test_causal_and_unbatched(close):
    m, d = pair(batch_first=True)
    x = inputs(True, True)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(L)  # float 0 / -inf
    r, g = both(m, d, x, attn_mask=causal, is_causal=True, need_weights=False)
    same(r, g, close, "is_causal")
    r, g = both(m, d, x, attn_mask=causal, is_causal=True, need_weights=True)
    same(r, g, close, "is_causal with weights")
    u = inputs(True, False, batched=False)
    r, g = both(m, d, u, key_padding_mask=torch.arange(S) >= S - 4)
    assert g[0].shape == (L, E) and g[1].shape == (L, S)
    same(r, g, close, "unbatched")
    with pytest.raises(RuntimeError, match="is_causal"):
        d(*x, is_causal=True)


def test_wrong_polarity_fails(close):
    """The comparison can fail: the same mask with the opposite polarity
    (SDPA's True = keep given as key_padding_mask) is far from PyTorch."""
    m, d = pair(batch_first=True)
    x = inputs(True, False)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[:, -9:] = True
    with torch.inference_mode():
        r = m(*x, key_padding_mask=kpm)[0]
        g = d(*x, key_padding_mask=~kpm)[0]
    with pytest.raises(AssertionError, match="out of tolerance"):
        close(g.numpy(), r.numpy(), **TOL)


def test_fully_masked_rows_give_zeros(close):
    m, d = pair(batch_first=True)
    x = inputs(True, False)
    am = torch.zeros(L, S, dtype=torch.bool)
    am[3] = True  # query 3 may see nothing
    with torch.inference_mode():
        g = d(*x, attn_mask=am, need_weights=False)[0]
        r = m(*x, attn_mask=am, need_weights=False)[0]
    # attention output 0 -> the row is out_proj's bias
    close(g[:, 3].numpy(), m.out_proj.bias.detach().expand(B, E).numpy(), **TOL)
    keep = [i for i in range(L) if i != 3]
    close(g[:, keep].numpy(), r[:, keep].numpy(), **TOL)


def test_state_dict_and_sharing():
    for kw in ({}, {"kdim": 24, "vdim": 40}, {"add_bias_kv": True}, {"bias": False}):
        m, d = pair(**kw)
        assert list(d.state_dict()) == list(m.state_dict()), kw
        for (n1, p1), (n2, p2) in zip(m.named_parameters(), d.named_parameters()):
            assert n1 == n2 and p1 is p2, (kw, n1)
        fresh = dt.MultiheadAttention(E, H, **kw)
        fresh.load_state_dict(m.state_dict())
        assert isinstance(fresh, torch.nn.MultiheadAttention)
        for k, v in fresh.state_dict().items():
            assert torch.equal(v, m.state_dict()[k]), (kw, k)
    m, d = pair()
    m.train()
    assert not dt.MultiheadAttention.from_module(m.eval()).training
    with pytest.raises(TypeError, match="MultiheadAttention"):
        dt.MultiheadAttention.from_module(torch.nn.Linear(2, 2))


def test_refusals():
    m, d = pair(batch_first=True)
    x = inputs(True, True)
    t = dt.MultiheadAttention(E, H, dropout=0.1, batch_first=True).train()
    with pytest.raises(RuntimeError, match="dropout"):
        t(*x)
    t.eval()
    t(*x)  # dropout is inactive in eval(), as in PyTorch
    out = d(*x, need_weights=False)[0]  # grad mode, parameters require grad
    assert out.requires_grad
    with pytest.raises(RuntimeError, match="forward-only"):
        out.sum().backward()
    out, w = d(*x)  # the weights too: no silent wrong gradient through them
    assert w.requires_grad
    with pytest.raises(RuntimeError, match="forward-only"):
        w.sum().backward()
    dd = dt.MultiheadAttention(E, H, batch_first=True).double().eval()
    with pytest.raises(TypeError, match="float64"):
        with torch.inference_mode():
            dd(*(a.double() for a in x))


def encoder(batch_first=True):
    torch.manual_seed(1)
    layer = torch.nn.TransformerEncoderLayer(E, H, dim_feedforward=96, batch_first=batch_first)
    return torch.nn.TransformerEncoder(layer, num_layers=2).eval()


def test_replace_in_transformer_encoder(close):
    P = 40
    ref = encoder()
    mod = encoder()
    paths = dt.replace_multihead_attention(mod)
    assert paths == ["layers.0.self_attn", "layers.1.self_attn"], paths
    assert all(isinstance(mod.layers[i].self_attn, dt.MultiheadAttention) for i in range(2))
    assert not mod.use_nested_tensor
    assert list(mod.state_dict()) == list(ref.state_dict())
    x = torch.randn(B, P, E)
    pad = torch.zeros(B, P, dtype=torch.bool)
    pad[:, -8:] = True
    with torch.inference_mode():
        r = ref(x, src_key_padding_mask=pad)  # nested tensors: padded rows come back as 0
        g = mod(x, src_key_padding_mask=pad)
    keep = ~pad
    close(g[keep].numpy(), r[keep].numpy(), what="encoder (unpadded rows)", **TOL)
    with pytest.raises(TypeError, match="from_module"):
        dt.replace_multihead_attention(torch.nn.MultiheadAttention(E, H))
    assert dt.replace_multihead_attention(mod) == []  # nothing left to replace


def test_finder_sees_nothing_square_in_the_drop_in():
    P = 80  # not E: a [B, P, P] of the shape of the input x would not be reported
    x = torch.randn(B, P, E)
    pad = torch.zeros(B, P, dtype=torch.bool)
    pad[:, -8:] = True
    layer = torch.nn.TransformerEncoderLayer(E, H, dim_feedforward=96, batch_first=True).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dt.ProductionModeWarning)
        before = dt.find_square_intermediates(layer, x, src_key_padding_mask=pad)
        assert any(f.shape == (B, H, P, P) for f in before), str(before)
        dt.replace_multihead_attention(layer)
        after = dt.find_square_intermediates(layer, x, src_key_padding_mask=pad)
        assert not after, str(after)
        m, d = pair(batch_first=True)
        assert dt.find_square_intermediates(m, x, x, x, key_padding_mask=pad, need_weights=False)
        assert not dt.find_square_intermediates(d, x, x, x, key_padding_mask=pad,
                                                need_weights=False)
        # the weights, when asked for, are L x S by definition: reported
        assert dt.find_square_intermediates(d, x, x, x, key_padding_mask=pad)


def test_seed_experiment_script_runs():
    """examples/torch_memory.py `one MODE P` (what `all` runs under
    memprobe) for each mode at a small P, and its usage errors."""
    import subprocess
    import sys
    from conftest import REPO
    script = str(REPO / "examples" / "torch_memory.py")
    for mode in ("fastpath", "dhsa"):  # each a fresh process importing PyTorch: seconds
        r = subprocess.run([sys.executable, script, "one", mode, "64"], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0 and "peak_rss_bytes" in r.stdout, (mode, r.stdout, r.stderr)
    for bad in (["one", "dhsa", "x"], ["one", "other", "64"], ["all", "--sizes", "1,2"]):
        r = subprocess.run([sys.executable, script] + bad, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 2 and "usage" in r.stderr, (bad, r.stderr)
