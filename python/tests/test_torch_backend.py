"""test_torch_backend.py: dhsa.torch's second back end (PyTorch's own
kernels, python/dhsa/torch/_backend.py), forced on the CPU with
backend="torch", against the C back end, where PyTorch is importable
(skipped, saying why, otherwise).

What must hold (issue 35): dense within 1e-5 in float32 (masks of both
polarities, bool and float, GQA, causal with q_pos0, window, softcap,
padding rows that see no key give zeros, lse); DHSA: the same routed
layout through both back ends gives outputs within 1e-5 (the torch back
end gathers the layout's keys per query block); the MultiheadAttention
drop-in and patch_transformers take backend="torch"; a tensor on another
device (meta here, standing for CUDA) goes to the torch back end, and
backend="c" refuses it; the finder sees nothing square in the torch back
end's drop-in at P = 8192.
"""

import warnings

import pytest

try:
    import torch
except Exception as e:  # not installed, or installed but broken
    pytest.skip("PyTorch is not importable: %s (make test-torch makes a venv with it)" % e,
                allow_module_level=True)

import dhsa  # noqa: E402
import dhsa.torch as dt  # noqa: E402
from dhsa.torch import _backend, _ops  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)


def qkv(B=2, Hq=4, Hkv=2, L=70, S=90, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, L, d, generator=g), torch.randn(B, Hkv, S, d, generator=g),
            torch.randn(B, Hkv, S, d, generator=g))


def both(q, k, v, **kw):
    """(C back end, torch back end) of _ops.attention with the same arguments."""
    with torch.inference_mode():
        return (_ops.attention(q, k, v, backend="c", **kw),
                _ops.attention(q, k, v, backend="torch", **kw))


def same(a, b, close, what):
    if isinstance(a, tuple):
        close(a[0].numpy(), b[0].numpy(), what=what + " (o)", **TOL)
        la, lb = a[1].numpy(), b[1].numpy()
        assert ((la == float("-inf")) == (lb == float("-inf"))).all(), what
        fin = la > float("-inf")
        close(la[fin], lb[fin], what=what + " (lse)", **TOL)
    else:
        close(a.numpy(), b.numpy(), what=what, **TOL)


def masks(B, Hq, L, S, rng):
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, -25:] = True                                  # True = ignore (MHA)
    keep_key = ~pad[:, None, None, :]                    # True = keep (SDPA), per key
    dense_bool = torch.from_numpy(rng.random((B, 1, L, S)) < 0.7)
    dense_float = torch.from_numpy(rng.standard_normal((1, Hq, L, S)).astype("float32"))
    return pad, keep_key, dense_bool, dense_float


@pytest.mark.parametrize("causal,q_pos0,window", [(False, 0, 0), (True, 0, 0), (True, 20, 0),
                                                  (True, 20, 13), (False, 5, 9)])
def test_dense_equals_c(causal, q_pos0, window, close, rng):
    q, k, v = qkv()
    B, Hq, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    pad, keep_key, dense_bool, dense_float = masks(B, Hq, L, S, rng)
    base = dict(causal=causal, q_pos0=q_pos0, window=window)
    for name, extra in [("plain", {}), ("kpm bool", dict(key_padding_mask=pad)),
                        ("kpm float", dict(key_padding_mask=torch.where(pad, -3.0, 0.5))),
                        ("attn_mask per key", dict(attn_mask=keep_key)),
                        ("both polarities", dict(key_padding_mask=pad, attn_mask=keep_key)),
                        ("dense bool", dict(attn_mask=dense_bool)),
                        ("dense float + kpm", dict(attn_mask=dense_float, key_padding_mask=pad)),
                        ("scale, softcap", dict(scale=0.2, softcap=3.0, key_padding_mask=pad)),
                        ("lse", dict(return_lse=True, attn_mask=dense_bool))]:
        a, b = both(q, k, v, **base, **extra)
        same(a, b, close, "%s %s" % (base, name))


def test_dense_layouts_gqa_and_wrong_polarity(close):
    q, k, v = qkv(Hq=6, Hkv=3)
    a, b = both(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="BLHD",
                causal=True, q_pos0=20)
    same(a, b, close, "BLHD GQA 6/3")
    assert b.shape == (2, 70, 6, 16)
    pad = torch.zeros(2, 90, dtype=torch.bool)
    pad[:, 60:] = True
    a, _ = both(q, k, v, key_padding_mask=pad)
    _, b = both(q, k, v, attn_mask=pad[:, None, None, :])  # the polarity turned the wrong way
    with pytest.raises(AssertionError, match="out of tolerance"):
        same(a, b, close, "wrong polarity")


def test_rows_with_no_key_are_zero(close):
    q, k, v = qkv(L=40, S=40)
    pad = torch.zeros(2, 40, dtype=torch.bool)
    pad[1] = True  # batch 1 sees no key
    for kw in (dict(key_padding_mask=pad), dict(key_padding_mask=pad, causal=True),
               dict(key_padding_mask=pad, return_lse=True)):
        a, b = both(q, k, v, **kw)
        same(a, b, close, str(list(kw)))
        o = b[0] if isinstance(b, tuple) else b
        assert torch.isfinite(o).all() and (o[1] == 0).all()


def test_sdpa_front_backend_torch(close, rng):
    q, k, v = qkv(Hq=4, Hkv=4)
    m = torch.from_numpy(rng.random((2, 1, 70, 90)) < 0.8)
    with torch.inference_mode():
        for kw in (dict(attn_mask=m), dict(is_causal=True), dict(scale=0.5)):
            a = dt.scaled_dot_product_attention(q, k, v, **kw)
            b = dt.scaled_dot_product_attention(q, k, v, backend="torch", **kw)
            close(a.numpy(), b.numpy(), what=str(list(kw)), **TOL)
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
            close(b.numpy(), ref.numpy(), what="vs PyTorch " + str(list(kw)), **TOL)


ROUTER = dict(density=0.25, dense_below=64, sink=8, local=16, q_block=16, min_chunk=4,
              chunk=8, max_chunk=32)


@pytest.mark.parametrize("causal,q_pos0", [(True, 0), (True, 100), (False, 0)])
def test_dhsa_same_layout_same_output(causal, q_pos0, close):
    q, k, v = qkv(B=2, Hq=4, Hkv=2, L=300 - q_pos0, S=300, d=32, seed=3)
    pad = torch.zeros(2, 300, dtype=torch.bool)
    pad[0, :30] = True
    g = torch.Generator().manual_seed(9)
    rows_bool = torch.rand(2, 1, q.shape[2], 300, generator=g) < 0.8
    heads_float = torch.randn(1, 4, 1, 300, generator=g)
    with dhsa.route(q.numpy(), k.numpy(), causal=causal, q_pos0=q_pos0, **ROUTER) as lay:
        st = lay.stats()
        assert 0 < st["density"] < 0.8, st  # routing is active
        for kw in ({}, dict(key_padding_mask=pad), dict(window=50, return_lse=True),
                   dict(softcap=4.0, attn_mask=~pad[:, None, None, :]),
                   dict(attn_mask=rows_bool), dict(attn_mask=heads_float, key_padding_mask=pad)):
            a, b = both(q, k, v, causal=causal, q_pos0=q_pos0, sparse=lay, **kw)
            same(a, b, close, "dhsa causal=%s q_pos0=%d %s" % (causal, q_pos0, list(kw)))
        dense = _ops.attention(q, k, v, backend="torch", causal=causal, q_pos0=q_pos0)
        sparse = _ops.attention(q, k, v, backend="torch", causal=causal, q_pos0=q_pos0,
                                sparse=lay)
        assert (dense - sparse).abs().max() > 1e-3  # the layout is used
    # the index the torch back end gathers holds exactly the layout's keys
    with dhsa.route(q.numpy(), k.numpy(), causal=causal, q_pos0=q_pos0, **ROUTER) as lay:
        idx, valid = _backend.layout_index(lay, "cpu")
        for (b, g, qb) in [(0, 0, 0), (1, 1, lay.n_blocks - 1), (0, 1, 5)]:
            r = lay.ranges(b, g, qb)
            want = sorted(j for s, e in r for j in range(s, e))
            assert idx[b, g, qb][valid[b, g, qb]].tolist() == want


def test_sdpa_front_routed_both_backends(close):
    q, k, v = qkv(B=1, Hq=4, Hkv=2, L=256, S=256, d=32, seed=4)
    sa, sb = [], []
    with torch.inference_mode():
        a = dt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                            sparse=ROUTER, sparse_stats=sa)
        b = dt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                            sparse=ROUTER, sparse_stats=sb, backend="torch")
    assert sa == sb and sa[0]["density"] < 0.8
    close(a.numpy(), b.numpy(), what="routed SDPA front", **TOL)


def test_mha_backend_torch(close):
    E, H, B, P = 32, 4, 2, 50
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    c = dt.MultiheadAttention.from_module(m)
    t = dt.MultiheadAttention.from_module(m, backend="torch")
    x = torch.randn(B, P, E)
    pad = torch.zeros(B, P, dtype=torch.bool)
    pad[1, -10:] = True
    with torch.inference_mode():
        oc, wc = c(x, x, x, key_padding_mask=pad)
        ot, wt = t(x, x, x, key_padding_mask=pad)
        close(oc.numpy(), ot.numpy(), what="MHA out", **TOL)
        close(wc.numpy(), wt.numpy(), what="MHA weights", **TOL)
        cm = torch.ones(P, P, dtype=torch.bool).triu(1)
        oc, _ = c(x, x, x, attn_mask=cm, is_causal=True, need_weights=False)
        ot, _ = t(x, x, x, attn_mask=cm, is_causal=True, need_weights=False)
        close(oc.numpy(), ot.numpy(), what="MHA causal", **TOL)
    with pytest.raises(ValueError, match="backend"):
        dt.MultiheadAttention(E, H, backend="cuda")


def test_other_devices_go_to_the_torch_backend(monkeypatch):
    q, k, v = (t.to("meta") for t in qkv(Hq=4, Hkv=4))
    with torch.inference_mode():
        o = dt.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert o.device.type == "meta" and o.shape == (2, 4, 70, 16)
    with pytest.raises(ValueError, match="backend='c'.*meta"):
        dt.scaled_dot_product_attention(q, k, v, backend="c")
    seen = []
    real = _backend.attention

    def spy(*a, **kw):
        seen.append(a[0].device.type)
        return real(*a, **kw)
    monkeypatch.setattr(_backend, "attention", spy)
    m = dt.MultiheadAttention(32, 4, batch_first=True, device="meta").eval()
    x = torch.zeros(2, 20, 32, device="meta")
    pad = torch.zeros(2, 20, dtype=torch.bool, device="meta")
    with torch.inference_mode():
        out, _ = m(x, x, x, key_padding_mask=pad, need_weights=False)
        dt.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 20, 32) and seen == ["meta", "meta"]
    # CPU tensors keep the C back end by default
    seen.clear()
    qc, kc, vc = qkv(Hq=4, Hkv=4)
    with torch.inference_mode():
        dt.scaled_dot_product_attention(qc, kc, vc)
    assert seen == []


def test_finder_sees_nothing_square_at_8192():
    E, H, P = 32, 2, 8192
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    d = dt.MultiheadAttention.from_module(m, backend="torch")
    x = torch.randn(1, P, E)
    pad = torch.zeros(1, P, dtype=torch.bool)
    pad[:, -100:] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dt.ProductionModeWarning)
        found = dt.find_square_intermediates(d, x, x, x, key_padding_mask=pad, need_weights=False)
        assert not found, str(found)
        # causal with padding: row-dependent, taken in chunks
        cm = torch.ones(1, 1, dtype=torch.bool)  # not read with is_causal (as documented)
        q = x.view(1, P, H, E // H).transpose(1, 2)
        found = dt.find_square_intermediates(_Call(lambda a: _ops.attention(
            a, a, a, backend="torch", causal=True, key_padding_mask=pad)), q)
        assert not found, str(found)
        del cm
        # the finder does see the square a plain PyTorch MHA builds (the test can fail)
        assert dt.find_square_intermediates(m, x[:, :1024], x[:, :1024], x[:, :1024],
                                            key_padding_mask=pad[:, :1024])


class _Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *a):
        return self.fn(*a)


def test_patch_transformers_backend_torch(close):
    transformers = pytest.importorskip("transformers", reason="transformers is not importable")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=512)
    m = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (2, 160))
    am = torch.ones(2, 160, dtype=torch.long)
    am[1, :20] = 0
    real = am.bool()
    router = dict(dense_below=64, sink=16, local=32, q_block=32)
    out = {}
    with torch.inference_mode():
        for be in ("c", "torch"):
            for method in ("dense", "dhsa"):
                dt.patch_transformers(m, method=method, density=0.25, backend=be, **router)
                out[be, method] = m(ids, attention_mask=am).logits[real]
                if method == "dhsa":
                    assert dt.model_stats(m)["density"] < 0.9
    for method in ("dense", "dhsa"):
        close(out["c", method].numpy(), out["torch", method].numpy(), what="llama " + method,
              atol=1e-4, rtol=1e-4)


def test_check_cli_device(tmp_path, capsys):
    """python -m dhsa.torch.check --device: the module and its inputs are
    moved first (cpu here; cuda in bench/gpu.sh); a bad device exits 2."""
    from dhsa.torch import check
    f = tmp_path / "guard.py"
    f.write_text("import torch\n"
                 "def mha():\n"
                 "    m = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()\n"
                 "    x = torch.randn(1, 64, 16); pad = torch.zeros(1, 64, dtype=torch.bool)\n"
                 "    pad[:, -8:] = True\n"
                 "    return m, (x, x, x), {'key_padding_mask': pad, 'need_weights': False}\n")
    assert check.main(["%s:mha" % f, "--device", "cpu", "--quiet"]) == 1
    assert "[1, 2, 64, 64]" in capsys.readouterr().out
    assert check.main(["%s:mha" % f, "--device", "nosuchdevice"]) == 2
    assert "--device nosuchdevice" in capsys.readouterr().err
