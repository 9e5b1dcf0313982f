"""test_attention.py: dhsa.attention against the float64 numpy reference
(conftest.py): shapes and tiling edges, causal / window / q_pos0 / softcap /
scale, GQA and MQA, dv != d, layouts and strided views (and that views are
not copied), float16 / bfloat16 inputs, LSE and merging by LSE, thread-count
determinism, both backends.

Tolerances: float32 compute with a degree-7 exp polynomial (relative error
~1e-7 per exp) and f32 accumulation over <= 300 keys: 2e-5 absolute +
1e-4 relative is ~10x the observed error. float16 outputs add one f16
rounding (2^-11 relative, values |o| < 3): 2e-3.
"""

import numpy as np
import pytest

import dhsa
from dhsa import _attention

F32 = dict(atol=2e-5, rtol=1e-4)
F16 = dict(atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("shape", [
    dict(B=1, Hq=1, Hkv=1, Lq=1, Lk=1, d=1),
    dict(B=2, Hq=4, Hkv=2, Lq=37, Lk=53, d=24),
    dict(B=1, Hq=2, Hkv=2, Lq=1, Lk=200, d=64),       # decode: Lq = 1, Lk over tiles
    dict(B=1, Hq=3, Hkv=1, Lq=130, Lk=67, d=17, dv=5),  # MQA, d odd, dv != d
    dict(B=1, Hq=8, Hkv=2, Lq=65, Lk=129, d=32),      # GQA 4, not multiples of 64
])
def test_plain(qkv, ref, close, shape):
    q, k, v = qkv(**shape)
    o, lse = dhsa.attention(q, k, v, return_lse=True)
    r, rl = ref(q, k, v)
    assert o.dtype == np.float32 and o.shape == r.shape
    close(o, r, what="o", **F32)
    close(lse, rl, what="lse", **F32)


@pytest.mark.parametrize("opts", [
    dict(causal=True),
    dict(causal=True, q_pos0=16),                 # chunked prefill
    dict(causal=True, window=9),
    dict(window=12, q_pos0=30),                   # window without causal: keys after the query too
    dict(causal=True, window=20, q_pos0=33),
    dict(softcap=1.5),
    dict(scale=0.37),
    dict(scale=-0.2, softcap=5.0, causal=True, q_pos0=5),
])
def test_options(qkv, ref, close, opts):
    q, k, v = qkv(B=2, Hq=4, Hkv=2, Lq=37, Lk=70, d=24)
    o, lse = dhsa.attention(q, k, v, return_lse=True, **opts)
    r, rl = ref(q, k, v, **opts)
    close(o, r, what="o %s" % opts, **F32)
    close(lse, rl, what="lse %s" % opts, **F32)


def test_gqa_8_over_2_reads_the_right_kv_head(qkv, ref, close):
    q, k, v = qkv(B=2, Hq=8, Hkv=2, Lq=20, Lk=45, d=16)
    o = dhsa.attention(q, k, v, causal=True, q_pos0=25)
    close(o, ref(q, k, v, causal=True, q_pos0=25)[0], **F32)
    # A wrong head mapping (h % Hkv instead of h // G) must be visible.
    wrong = ref(q, np.tile(k, (1, 4, 1, 1)), np.tile(v, (1, 4, 1, 1)), causal=True, q_pos0=25)[0]
    with pytest.raises(AssertionError):
        close(o, wrong, **F32)


def test_blhd_non_contiguous_views_are_not_copied(rng, ref, close):
    # Slices of bigger batch-first buffers: heads and dims cut, every stride odd.
    big = rng.standard_normal((3, 50, 7, 40)).astype(np.float32)
    q = big[1:3, 5:36, 1:7, 3:27]           # [B=2, Lq=31, Hq=6, d=24]
    kbig = rng.standard_normal((2, 60, 5, 30)).astype(np.float32)
    k = kbig[:, 10:57, 1:4, 2:26]          # [2, 47, 3, 24]
    v = kbig[:, 10:57, 1:4, 4:28]          # overlaps k's memory: read-only, fine
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    for name, a in (("q", q), ("k", k), ("v", v)):
        tv, used = _attention._tensor_view(name, a, "BLHD")
        assert used is a and tv.data == a.ctypes.data, name
    o = dhsa.attention(q, k, v, layout="BLHD", causal=True, q_pos0=16)
    assert o.shape == (2, 31, 6, 24)
    t = lambda x: x.transpose(0, 2, 1, 3)
    r = ref(t(q), t(k), t(v), causal=True, q_pos0=16)[0]
    close(t(o), r, **F32)


def test_bhld_view_of_batch_first_memory(qkv, ref, close):
    q, k, v = qkv(B=2, Hq=4, Hkv=4, Lq=19, Lk=23, d=8)
    # BHLD-shaped views whose memory is batch-first: passed by strides.
    qb = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    tv, used = _attention._tensor_view("q", qb, "BHLD")
    assert used is qb and list(tv.stride) == [19 * 4 * 8, 8, 4 * 8, 1]
    close(dhsa.attention(qb, k, v), ref(q, k, v)[0], **F32)


def test_negative_and_unaligned_strides_are_copied(qkv, ref, close):
    q, k, v = qkv(B=1, Hq=2, Hkv=2, Lq=11, Lk=13, d=8)
    kr = k[:, :, ::-1]  # negative stride: C requires non-negative, so one copy
    tv, used = _attention._tensor_view("k", kr, "BHLD")
    assert used is not kr and used.flags.c_contiguous
    close(dhsa.attention(q, kr, v), ref(q, kr, v)[0], **F32)
    # Byte strides not a multiple of the item size: a packed record array.
    rec = np.zeros(q.size, dtype=[("a", np.uint8), ("x", np.float32)])
    rec["x"] = q.ravel()
    qx = rec["x"].reshape(q.shape)
    assert qx.strides[-1] == 5
    tv, used = _attention._tensor_view("q", qx, "BHLD")
    assert used is not qx
    close(dhsa.attention(qx, k, v), ref(q, k, v)[0], **F32)


def test_float16_inputs_give_float16_output(qkv, ref, close):
    q, k, v = qkv(B=2, Hq=4, Hkv=2, Lq=30, Lk=41, d=16, dtype=np.float16)
    o, lse = dhsa.attention(q, k, v, causal=True, q_pos0=11, return_lse=True)
    assert o.dtype == np.float16 and lse.dtype == np.float32
    r, rl = ref(q, k, v, causal=True, q_pos0=11)  # reference on the f16 values themselves
    close(o, r, what="o f16", **F16)
    close(lse, rl, what="lse f16", **F32)


def test_mixed_types_f32_query_f16_kv(qkv, ref, close):
    q, k, v = qkv(B=1, Hq=4, Hkv=1, Lq=9, Lk=70, d=16)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    o = dhsa.attention(q, k16, v16)
    assert o.dtype == np.float32
    close(o, ref(q, k16, v16)[0], **F32)


def test_bfloat16_bits_with_explicit_dtype(qkv, ref, close):
    q, k, v = qkv(B=1, Hq=4, Hkv=2, Lq=17, Lk=33, d=16)
    qb, kb, vb = (dhsa.to_bfloat16(x) for x in (q, k, v))
    with pytest.raises(TypeError, match="dtype='bfloat16'"):
        dhsa.attention(qb, kb, vb)
    o = dhsa.attention(qb, kb, vb, dtype="bfloat16")
    assert o.dtype == np.float32
    # The reference reads the same bits (decoded by shifting, independently).
    dec = lambda b: (b.astype(np.uint32) << 16).view(np.float32)
    close(o, ref(dec(qb), dec(kb), dec(vb))[0], **F32)


def test_lse_merges_partial_results(qkv, close):
    # Attention over keys [0, 40) and [40, 90) merged by LSE = attention over all.
    q, k, v = qkv(B=1, Hq=2, Hkv=2, Lq=12, Lk=90, d=16)
    o1, l1 = dhsa.attention(q, k[:, :, :40], v[:, :, :40], return_lse=True)
    o2, l2 = dhsa.attention(q, k[:, :, 40:], v[:, :, 40:], return_lse=True)
    o, l = dhsa.attention(q, k, v, return_lse=True)
    m = np.maximum(l1, l2)
    w1, w2 = np.exp(l1 - m)[..., None], np.exp(l2 - m)[..., None]
    close((w1 * o1 + w2 * o2) / (w1 + w2), o, **F32)
    close(m + np.log(np.exp(l1 - m) + np.exp(l2 - m)), l, **F32)


def test_results_do_not_depend_on_thread_count(qkv):
    q, k, v = qkv(B=2, Hq=8, Hkv=2, Lq=150, Lk=170, d=32)
    a = dhsa.attention(q, k, v, causal=True, threads=1)
    b = dhsa.attention(q, k, v, causal=True, threads=3)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("backend", ["reference", "tiled", "auto"])
def test_backends_agree_with_reference(qkv, ref, close, backend):
    q, k, v = qkv(B=1, Hq=4, Hkv=2, Lq=25, Lk=31, d=8)
    o = dhsa.attention(q, k, v, causal=True, softcap=2.0, backend=backend)
    close(o, ref(q, k, v, causal=True, softcap=2.0)[0], **F32)


def test_empty_query_and_key_lengths(qkv):
    q, k, v = qkv(B=1, Hq=2, Hkv=2, Lq=0, Lk=5, d=4)
    assert dhsa.attention(q, k, v).shape == (1, 2, 0, 4)
    q, k, v = qkv(B=1, Hq=2, Hkv=2, Lq=3, Lk=0, d=4)
    o, lse = dhsa.attention(q, k, v, return_lse=True)  # every row empty: zeros, -inf
    assert np.all(o == 0) and np.all(lse == -np.inf)


def test_ml_dtypes_bfloat16_arrays_are_taken_directly(qkv, ref, close):
    try:
        import ml_dtypes
    except Exception as e:
        pytest.skip("ml_dtypes is not importable: %s" % e)
    q, k, v = qkv(B=1, Hq=2, Hkv=1, Lq=9, Lk=21, d=8)
    qb, kb, vb = (x.astype(ml_dtypes.bfloat16) for x in (q, k, v))
    o = dhsa.attention(qb, kb, vb)
    assert o.dtype == np.float32
    f = lambda x: x.astype(np.float32)
    close(o, ref(f(qb), f(kb), f(vb))[0], **F32)
