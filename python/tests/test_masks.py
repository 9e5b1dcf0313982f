"""test_masks.py: every PyTorch mask convention, by name, against the
float64 reference told by hand what each one means:

  key_padding_mask bool  True = ignore the key    -> reference keep = ~m
  key_padding_mask float added                    -> reference bias = m
  attn_mask bool         True = take part         -> reference dense = 0 / -inf
  attn_mask float        added                    -> reference dense = m

plus proofs that the wrong polarity changes the result, combinations, and
rows with no allowed key (zeros and lse = -inf, never NaN).
"""

import numpy as np
import pytest

import dhsa

F32 = dict(atol=2e-5, rtol=1e-4)
B, HQ, HKV, LQ, LK, D = 2, 4, 2, 21, 67, 16


@pytest.fixture
def data(qkv):
    return qkv(B=B, Hq=HQ, Hkv=HKV, Lq=LQ, Lk=LK, d=D)


def padding(rng):
    """[B, Lk] bool, True = padding: the last keys of each batch, plus a few
    random ones, and never all keys."""
    m = rng.random((B, LK)) < 0.2
    m[0, -9:] = True
    m[1, -30:] = True
    m[:, 0] = False
    return m


def additive(keep):
    return np.where(keep, 0.0, -np.inf)

# ---------------------------------------------------------- key padding ---


def test_key_padding_mask_bool_true_ignores(data, rng, ref, close):
    q, k, v = data
    m = padding(rng)
    o, lse = dhsa.attention(q, k, v, key_padding_mask=m, return_lse=True)
    r, rl = ref(q, k, v, keep=~m)
    close(o, r, what="o", **F32)
    close(lse, rl, what="lse", **F32)


def test_key_padding_mask_broadcast_over_batch(data, rng, ref, close):
    q, k, v = data
    m = padding(rng)[:1]
    close(dhsa.attention(q, k, v, key_padding_mask=m), ref(q, k, v, keep=~m)[0], **F32)


def test_key_padding_mask_float_is_added_not_made_bool(data, rng, ref, close):
    q, k, v = data
    bias = rng.standard_normal((B, LK)).astype(np.float32)
    bias[:, 3] = 0.0
    bias[:, 5] = 1.0  # as a bool this would be "ignore"; as a float it is +1
    bias[1, -4:] = -np.inf
    o = dhsa.attention(q, k, v, key_padding_mask=bias)
    close(o, ref(q, k, v, bias=bias)[0], **F32)
    # If the binding had turned it into bool (nonzero = ignore), the result
    # would be attention over the zero-bias keys only: clearly different.
    as_bool = ref(q, k, v, keep=~(bias != 0))[0]
    assert np.abs(o - as_bool).max() > 0.1
    # float64 / float16 masks are converted to float32 and still added
    close(dhsa.attention(q, k, v, key_padding_mask=bias.astype(np.float64)), o, **F32)


def test_key_padding_mask_float_zero_neg_inf_equals_bool(data, rng, close):
    q, k, v = data
    m = padding(rng)
    a = dhsa.attention(q, k, v, key_padding_mask=m)
    b = dhsa.attention(q, k, v, key_padding_mask=np.where(m, -np.inf, 0.0).astype(np.float32))
    close(a, b, **F32)


def test_key_padding_mask_non_contiguous_view(data, rng, ref, close):
    q, k, v = data
    wide = rng.random((B, 3 * LK)) < 0.3
    m = wide[:, ::3]  # key stride 3 bytes: copied to rows (small, [B, Lk])
    close(dhsa.attention(q, k, v, key_padding_mask=m), ref(q, k, v, keep=~m)[0], **F32)
    f = rng.standard_normal((B, LK + 5)).astype(np.float32)[:, 2:2 + LK]  # batch stride != Lk
    close(dhsa.attention(q, k, v, key_padding_mask=f), ref(q, k, v, bias=f)[0], **F32)

# ------------------------------------------------------------ attn_mask ---


@pytest.mark.parametrize("shape", [(LQ, LK), (B, 1, LQ, LK), (B, HQ, LQ, LK), (1, HQ, LQ, LK),
                                   (B, 1, 1, LK), (1, 1, LK), (LK,), (B, HQ, 1, LK),
                                   (B, 1, LQ, 1)])
def test_attn_mask_bool_true_keeps(data, rng, ref, close, shape):
    q, k, v = data
    m = rng.random(shape) < 0.7
    m[..., 0] = True  # at least one key per row
    o, lse = dhsa.attention(q, k, v, attn_mask=m, return_lse=True)
    r, rl = ref(q, k, v, dense=additive(m))
    close(o, r, what="o %s" % (shape,), **F32)
    close(lse, rl, what="lse %s" % (shape,), **F32)


@pytest.mark.parametrize("shape", [(LQ, LK), (B, 1, LQ, LK), (B, HQ, LQ, LK), (B, 1, 1, LK),
                                   (HQ, 1, LK)])
def test_attn_mask_float_is_added(data, rng, ref, close, shape):
    q, k, v = data
    m = rng.standard_normal(shape).astype(np.float32)
    close(dhsa.attention(q, k, v, attn_mask=m), ref(q, k, v, dense=m)[0], what=str(shape), **F32)
    # a float64 non-contiguous mask: converted (at its own size) and still added
    m64 = np.asfortranarray(m.astype(np.float64))
    close(dhsa.attention(q, k, v, attn_mask=m64), ref(q, k, v, dense=m)[0], **F32)


def test_dense_float_attn_mask_is_passed_by_strides(data, rng, ref, close):
    q, k, v = data
    big = rng.standard_normal((B, HQ, LQ + 2, LK + 7)).astype(np.float32)
    m = big[:, :, 1:1 + LQ, 3:3 + LK]
    desc, keep, _, _ = dhsa._attention._build(
        q, k, v, causal=False, scale=None, key_padding_mask=None, attn_mask=m, window=0,
        softcap=0.0, layout="BHLD", backend=None, q_pos0=0, return_lse=False, dtype=None,
        check_finite=False, reference_max_bytes=None, query_only=False)
    assert desc.attn_mask.data == m.ctypes.data  # no copy
    close(dhsa.attention(q, k, v, attn_mask=m), ref(q, k, v, dense=m)[0], **F32)

# ------------------------------------------------------ polarity proofs ---


def test_polarity_key_padding_mask_is_not_attn_mask(data, rng, close):
    """The same bool [B, Lk] mask means opposite things under the two names:
    key_padding_mask=m equals attn_mask=~m (as [B, 1, 1, Lk]) and differs
    from attn_mask=m."""
    q, k, v = data
    m = padding(rng)
    kpm = dhsa.attention(q, k, v, key_padding_mask=m)
    same = dhsa.attention(q, k, v, attn_mask=~m[:, None, None, :])
    opposite = dhsa.attention(q, k, v, attn_mask=m[:, None, None, :])
    close(kpm, same, **F32)
    assert np.abs(kpm - opposite).max() > 0.1
    with pytest.raises(AssertionError):
        close(kpm, opposite, **F32)
    # The same through the dense path (a per-query mask, so it cannot take the
    # per-key slot): rows identical, polarity SDPA's.
    dense = np.broadcast_to(~m[:, None, None, :], (B, 1, LQ, LK))
    close(kpm, dhsa.attention(q, k, v, attn_mask=dense), **F32)


def test_attn_mask_2d_is_query_by_key_not_batch_by_key(data, rng, ref, close):
    # SDPA broadcasting: a 2-D attn_mask is [Lq, Lk]. With Lq == B it must
    # still be read per query row, not per batch.
    q, k, v = (x[:, :, :B] if i == 0 else x for i, x in enumerate(data))
    m = rng.random((B, LK)) < 0.5
    m[:, 0] = True
    o = dhsa.attention(q, k, v, attn_mask=m)
    close(o, ref(q, k, v, dense=additive(m))[0], **F32)
    with pytest.raises(AssertionError):
        close(o, ref(q, k, v, keep=m)[0], **F32)


def test_combined_key_padding_and_attn_masks(data, rng, ref, close):
    q, k, v = data
    m = padding(rng)
    am = rng.random((B, 1, 1, LK)) < 0.8
    am[:, :, :, 1] = True
    r = ref(q, k, v, keep=~m & am[:, 0, 0, :])[0]
    close(dhsa.attention(q, k, v, key_padding_mask=m, attn_mask=am), r, **F32)
    fb = rng.standard_normal((B, LK)).astype(np.float32)
    af = rng.standard_normal((1, 1, 1, LK)).astype(np.float32)
    close(dhsa.attention(q, k, v, key_padding_mask=fb, attn_mask=af),
          ref(q, k, v, bias=fb + af[0, 0]) [0], **F32)
    dm = rng.random((LQ, LK)) < 0.8
    dm[:, 1] = True
    close(dhsa.attention(q, k, v, key_padding_mask=m, attn_mask=dm, causal=True, q_pos0=10),
          ref(q, k, v, keep=~m, dense=additive(dm), causal=True, q_pos0=10)[0], **F32)

# ---------------------------------------------------- rows with no keys ---


def test_all_masked_rows_give_zeros_and_neg_inf_lse(data, rng, ref, close):
    q, k, v = data
    m = padding(rng)
    m[1, :] = True  # batch 1: every key is padding
    o, lse = dhsa.attention(q, k, v, key_padding_mask=m, return_lse=True)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    assert np.all(o[1] == 0) and np.all(lse[1] == -np.inf)
    r, rl = ref(q, k, v, keep=~m)
    close(o, r, **F32)
    close(lse, rl, **F32)


def test_all_false_attn_mask_rows_and_window_gaps(data, ref, close):
    q, k, v = data
    am = np.ones((LQ, LK), dtype=bool)
    am[4] = False
    o, lse = dhsa.attention(q, k, v, attn_mask=am, return_lse=True)
    assert np.all(o[:, :, 4] == 0) and np.all(lse[:, :, 4] == -np.inf)
    assert not np.isnan(o).any()
    close(o, ref(q, k, v, dense=additive(am))[0], **F32)
    # causal with a q_pos0 beyond the keys and a window leaves nothing
    o, lse = dhsa.attention(q, k, v, causal=True, window=3, q_pos0=LK + 5, return_lse=True)
    assert np.all(o == 0) and np.all(lse == -np.inf)


def test_all_neg_inf_float_mask_row(data, ref, close):
    q, k, v = data
    bias = np.zeros((B, LK), np.float32)
    bias[0] = -np.inf
    o, lse = dhsa.attention(q, k, v, key_padding_mask=bias, return_lse=True)
    assert np.all(o[0] == 0) and np.all(lse[0] == -np.inf) and not np.isnan(o).any()
    close(o, ref(q, k, v, bias=bias)[0], **F32)

# ----------------------------------------------------- argument errors ---


def test_mask_argument_errors(data):
    q, k, v = data
    with pytest.raises(ValueError, match=r"key_padding_mask must be \[B, Lk\]"):
        dhsa.attention(q, k, v, key_padding_mask=np.zeros((LK,), bool))
    with pytest.raises(TypeError, match="key_padding_mask has dtype uint8"):
        dhsa.attention(q, k, v, key_padding_mask=np.zeros((B, LK), np.uint8))
    with pytest.raises(TypeError, match="attn_mask has dtype int64"):
        dhsa.attention(q, k, v, attn_mask=np.zeros((LQ, LK), np.int64))
    with pytest.raises(ValueError, match="does not broadcast"):
        dhsa.attention(q, k, v, attn_mask=np.zeros((3, LQ, LK), bool))
    with pytest.raises(ValueError, match="does not broadcast"):
        dhsa.attention(q, k, v, attn_mask=np.zeros((LK, LQ), bool))
