"""test_torch_sdpa.py: dhsa.torch.scaled_dot_product_attention against
torch.nn.functional.scaled_dot_product_attention (and the float64 numpy
reference of conftest.py), where PyTorch is importable (skipped, saying
why, otherwise): masks bool and float of every broadcast shape, is_causal,
scale, GQA, 3-D inputs, float16/bfloat16, non-contiguous views, sparse=
(a select-all layout and density 1 equal dense; routed calls record their
density), the refusals, and that no input is copied.
"""

import numpy as np
import pytest

try:
    import torch
except Exception as e:  # not installed, or installed but broken
    pytest.skip("PyTorch is not importable: %s (make test-torch makes a venv with it)" % e,
                allow_module_level=True)

import dhsa  # noqa: E402
import dhsa.torch as dt  # noqa: E402

F = torch.nn.functional
TOL = dict(atol=1e-5, rtol=1e-5)


def qkv(B=2, Hq=4, Hkv=4, L=33, S=47, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, L, d, generator=g).to(dtype),
            torch.randn(B, Hkv, S, d, generator=g).to(dtype),
            torch.randn(B, Hkv, S, d, generator=g).to(dtype))


def test_plain_scale_causal(close, ref):
    q, k, v = qkv()
    with torch.inference_mode():
        close(dt.scaled_dot_product_attention(q, k, v).numpy(),
              F.scaled_dot_product_attention(q, k, v).numpy(), **TOL)
        close(dt.scaled_dot_product_attention(q, k, v, scale=0.3).numpy(),
              F.scaled_dot_product_attention(q, k, v, scale=0.3).numpy(), **TOL)
        close(dt.scaled_dot_product_attention(q, k, v, is_causal=True).numpy(),
              F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy(), **TOL)
    o_ref, _ = ref(q.numpy(), k.numpy(), v.numpy(), causal=True)  # independent float64
    close(dt.scaled_dot_product_attention(q, k, v, is_causal=True).numpy(), o_ref, **TOL)


@pytest.mark.parametrize("shape", [(33, 47), (2, 1, 33, 47), (2, 4, 33, 47),
                                   (2, 1, 1, 47), (1, 4, 1, 47)])
def test_masks(shape, close, rng):
    q, k, v = qkv()
    m = torch.from_numpy(rng.random(shape) < 0.6)
    m[..., 0] = True
    f = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    with torch.inference_mode():
        close(dt.scaled_dot_product_attention(q, k, v, attn_mask=m).numpy(),
              F.scaled_dot_product_attention(q, k, v, attn_mask=m).numpy(),
              what="bool %s" % (shape,), **TOL)
        close(dt.scaled_dot_product_attention(q, k, v, f).numpy(),
              F.scaled_dot_product_attention(q, k, v, f).numpy(),
              what="float %s" % (shape,), **TOL)
        # the opposite polarity is far off: the comparison can fail
        with pytest.raises(AssertionError, match="out of tolerance"):
            close(dt.scaled_dot_product_attention(q, k, v, attn_mask=~m).numpy(),
                  F.scaled_dot_product_attention(q, k, v, attn_mask=m).numpy(), **TOL)


def test_gqa_3d_and_views(close):
    q, k, v = qkv(Hq=8, Hkv=2)
    with torch.inference_mode():
        close(dt.scaled_dot_product_attention(q, k, v, enable_gqa=True).numpy(),
              F.scaled_dot_product_attention(q, k, v, enable_gqa=True).numpy(), **TOL)
        with pytest.raises(RuntimeError, match="enable_gqa"):
            dt.scaled_dot_product_attention(q, k, v)
        q3, k3, v3 = q[:, 0], k[:, 0], v[:, 0]  # [B, L, E]: 3-D
        m3 = torch.ones(2, 33, 47, dtype=torch.bool).tril_(5)
        close(dt.scaled_dot_product_attention(q3, k3, v3, attn_mask=m3).numpy(),
              F.scaled_dot_product_attention(q3, k3, v3, attn_mask=m3).numpy(), **TOL)
        # batch-first projections viewed as [B, H, L, d]: strides, no copy
        x = torch.randn(2, 33, 4 * 16)
        qv = x.view(2, 33, 4, 16).transpose(1, 2)
        close(dt.scaled_dot_product_attention(qv, qv, qv).numpy(),
              F.scaled_dot_product_attention(qv, qv, qv).numpy(), **TOL)


def test_half_precision(close):
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
        q, k, v = qkv(dtype=dtype)
        with torch.inference_mode():
            o = dt.scaled_dot_product_attention(q, k, v, is_causal=True)
            r = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        assert o.dtype == dtype
        close(o.float().numpy(), r.numpy(), atol=tol, rtol=tol, what=str(dtype))


def test_no_copies():
    """The arrays C reads are the tensors' own memory: a numpy view of a
    tensor shares its pointer, and dhsa is called with those views."""
    q, k, v = qkv()
    from dhsa.torch import _ops
    for t in (q, q.transpose(1, 2), q[:, :, 3:], torch.randn(4, 8, 2)[:, ::2]):
        a, _ = _ops.as_numpy("t", t)
        assert a.ctypes.data == t.data_ptr(), "copied"
    b, is_bf = _ops.as_numpy("b", q.to(torch.bfloat16))
    assert is_bf and b.dtype == np.uint16
    o = dt.scaled_dot_product_attention(q, k, v)
    assert o.data_ptr() == o.numpy().ctypes.data  # the array C wrote, wrapped


def test_fully_masked_row_gives_zeros():
    q, k, v = qkv()
    m = torch.ones(33, 47, dtype=torch.bool)
    m[5] = False
    o = dt.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert torch.all(o[:, :, 5] == 0) and not torch.isnan(o).any()


def test_sparse(close):
    q, k, v = qkv(L=300, S=300, d=32, Hkv=2, Hq=4)
    with torch.inference_mode():
        dense = dt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        # density 1: every key selected: dense
        st = []
        full = dt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                               sparse={"density": 1.0}, sparse_stats=st)
        close(full.numpy(), dense.numpy(), **TOL)
        assert st and st[0]["density"] == 1.0
        # routed at 6.25% with small sinks/local so short sequences are sparse
        st = []
        low = dt.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True, sparse_stats=st,
            sparse=dict(density=0.0625, dense_below=64, sink=16, local=32, q_block=32))
        assert 0 < st[0]["density"] < 0.5, st[0]
        assert float((low - dense).abs().max()) > 1e-3  # it really skipped keys
        # a Layout given by the caller: select-all equals dense
        lay = dhsa.Layout.empty(2, 2, 300, 300, 64, 1)
        for b in range(2):
            for g in range(2):
                for qb in range(lay.n_blocks):
                    lay.set(b, g, qb, [[0, 300]])
        close(dt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                              sparse=lay).numpy(), dense.numpy(), **TOL)
        lay.close()
        with pytest.raises(TypeError, match="sparse must be"):
            dt.scaled_dot_product_attention(q, k, v, enable_gqa=True, sparse=3)


def test_refusals():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="dropout"):
        dt.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    with pytest.raises(RuntimeError, match="is_causal"):
        dt.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(33, 47, dtype=torch.bool),
                                        is_causal=True)
    with pytest.raises(TypeError, match="float64"):
        dt.scaled_dot_product_attention(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="2-D, 3-D or 4-D"):
        dt.scaled_dot_product_attention(q[None], k[None], v[None])
    qg = q.clone().requires_grad_()
    o = dt.scaled_dot_product_attention(qg, k, v)
    with pytest.raises(RuntimeError, match="forward-only"):
        o.sum().backward()
