"""test_route.py: routing and sparse attention from Python (dhsa.route,
dhsa.Layout, attention(sparse=...), dhsa.KVIndex, dhsa.Predictor,
dhsa.synth, dhsa.fidelity).

The sparse path is checked independently: the float64 reference of
conftest.py is given an additive 0 / -inf mask built in numpy from the
layout's ranges (or, for hand-made layouts, from the ranges the test set),
query head h reading KV head h // (Hq / Hkv); the wrong references
(unmasked, or the wrong head mapping) are shown to fail. Router contracts
(budget, sinks, local diagonal, density) are recomputed in numpy from the
ranges. Struct mirrors are checked against a compiled C program. Sizes stay
small (L <= 4096, d = 32) so the file runs in a few seconds.
"""

import ctypes
import dataclasses
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import dhsa
from dhsa import _capi
from conftest import REPO

F32 = dict(atol=2e-5, rtol=1e-4)
# routing that is really sparse at L of a few thousand (the C defaults keep
# blocks that may see < 2048 keys dense)
SMALL = dict(sink=16, local=32, dense_below=256)

# ------------------------------------------------------------ helpers ---


def layout_mask(lay, Hq):
    """[B, Hq, Lq, Lk] bool from lay.ranges(): True where a query row's
    block selects the key; query head h uses KV head h // (Hq // Hkv)."""
    m = np.zeros((lay.B, lay.Hkv, lay.Lq, lay.Lk), dtype=bool)
    for b in range(lay.B):
        for g in range(lay.Hkv):
            for qb in range(lay.n_blocks):
                r0, r1 = qb * lay.q_block, min((qb + 1) * lay.q_block, lay.Lq)
                for s, e in lay.ranges(b, g, qb):
                    m[b, g, r0:r1, s:e] = True
    return np.repeat(m, Hq // lay.Hkv, axis=1)


def additive(mask):
    return np.where(mask, 0.0, -np.inf)


def block_span(qb, q_block, Lq, Lk, causal=True, q_pos0=0):
    """Keys [lo, hi) the rows of block qb may see (causal, no window)."""
    last = q_pos0 + min((qb + 1) * q_block, Lq) - 1
    return 0, (min(last + 1, Lk) if causal else Lk)


@pytest.fixture(scope="module")
def work():
    """Synthetic workload, L = 1024: (q, k, v, needles)."""
    return dhsa.synth(1024, Hq=4, Hkv=2, d=32, seed=3)


@pytest.fixture(scope="module")
def work4k():
    return dhsa.synth(4096, Hq=4, Hkv=2, d=32, seed=1)

# ------------------------------------------------------- C mirrors ---


NEW_STRUCTS = {"RouterParams": "dhsa_router_params", "LayoutStats": "dhsa_layout_stats",
               "SynthParams": "dhsa_synth_params", "SynthNeedle": "dhsa_synth_needle",
               "Fidelity": "dhsa_fidelity"}


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="sizes computed for LP64")
def test_struct_sizes_lp64():
    for name in NEW_STRUCTS:
        assert ctypes.sizeof(getattr(_capi, name)) == _capi.LP64_SIZES[name], name


def test_struct_offsets_match_compiled_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "dhsa.h"', "int main(void) {"]
    for name, cname in NEW_STRUCTS.items():
        lines.append('printf("%s sizeof %%zu\\n", sizeof(%s));' % (cname, cname))
        for field, _ in getattr(_capi, name)._fields_:
            lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));'
                         % (cname, field, cname, field))
    consts = ["DHSA_SYNTH_MAX_NEEDLES", "DHSA_BOUNDARY_FIXED", "DHSA_BOUNDARY_SIMILARITY",
              "DHSA_BOUNDARY_LEARNED", "DHSA_ROUTE_DHSA", "DHSA_ROUTE_STREAM", "DHSA_ROUTE_ORACLE"]
    for name in consts:
        lines.append('printf("const %s %%d\\n", (int)%s);' % (name, name))
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", str(REPO / "include"), str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    got = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        a, b, value = line.split()
        got[(a, b)] = int(value)
    for name in consts:
        assert got[("const", name)] == getattr(_capi, name), name
    for name, cname in NEW_STRUCTS.items():
        cls = getattr(_capi, name)
        assert got[(cname, "sizeof")] == ctypes.sizeof(cls), cname
        for field, _ in cls._fields_:
            assert got[(cname, field)] == getattr(cls, field).offset, "%s.%s" % (cname, field)


def test_router_params_defaults_are_the_c_defaults():
    mine, pred = dhsa.RouterParams().to_c()
    assert pred is None
    c = _capi.lib().dhsa_router_default_params()
    for field, _ in _capi.RouterParams._fields_:
        assert getattr(mine, field) == getattr(c, field), field
    # the names that differ from C reach the right C fields
    rp, _ = dhsa.RouterParams(method="block", budget=300, sink=5, local=7, share_heads=True,
                              causal_boundaries=True, learned_threshold=0.25).to_c()
    assert (rp.method, rp.boundary) == (_capi.DHSA_ROUTE_DHSA, _capi.DHSA_BOUNDARY_FIXED)
    assert (rp.budget_tokens, rp.sink_tokens, rp.local_tokens) == (300, 5, 7)
    assert rp.share_heads == 1 and rp.causal_boundaries == 1 and rp.learned_threshold == 0.25
    rp, _ = dhsa.RouterParams(method="oracle", boundary="fixed").to_c()
    assert (rp.method, rp.boundary) == (_capi.DHSA_ROUTE_ORACLE, _capi.DHSA_BOUNDARY_FIXED)

# ------------------------------------------------------------ synth ---


def test_synth_shapes_needles_and_determinism():
    q, k, v, needles = dhsa.synth(1024, Hq=4, Hkv=2, d=16, seed=5, depths=(0.2, 0.5))
    assert q.shape == (1, 4, 1024, 16) and k.shape == v.shape == (1, 2, 1024, 16)
    assert q.dtype == k.dtype == v.dtype == np.float32
    assert [set(n) for n in needles] == [{"key", "len", "row", "rows"}] * 2
    # the deepest needle (largest depth) is asked for by the last block, the
    # next by the block before it
    assert needles[0]["key"] == int(0.2 * 1024) and needles[0]["len"] == 16
    assert needles[1]["key"] == 512
    assert needles[1]["row"] == 1024 - 64 and needles[0]["row"] == 1024 - 128
    assert all(n["rows"] == 64 for n in needles)
    q2, k2, v2, n2 = dhsa.synth(1024, Hq=4, Hkv=2, d=16, seed=5, depths=(0.2, 0.5))
    assert np.array_equal(q, q2) and np.array_equal(k, k2) and np.array_equal(v, v2)
    assert n2 == needles
    assert not np.array_equal(dhsa.synth(1024, Hq=4, Hkv=2, d=16, seed=6)[1], k)
    assert dhsa.synth(256, Hq=2, Hkv=1, d=8, depths=())[3] == []


def test_synth_errors_carry_the_c_sentence():
    with pytest.raises(dhsa.DhsaError, match="needle depth 1.5 is not in"):
        dhsa.synth(1024, d=8, depths=(0.1, 1.5))
    with pytest.raises(dhsa.DhsaError, match=r"synthetic sizes B=1 Hq=6 Hkv=4"):
        dhsa.synth(256, Hq=6, Hkv=4, d=8)
    with pytest.raises(dhsa.DhsaError, match=r"synthetic sizes .* L=0"):
        dhsa.synth(0, d=8)
    with pytest.raises(dhsa.DhsaError, match="5 needles need as many query blocks"):
        dhsa.synth(256, d=8, depths=(0.1, 0.2, 0.3, 0.4, 0.5))
    with pytest.raises(ValueError):
        dhsa.synth(256, d=8, depths=[0.1] * 65)

# --------------------------------------------------------- routing ---


def test_route_density_near_target_and_router_contract(work4k):
    q, k, v, _ = work4k
    target = 0.125
    lay = dhsa.route(q, k, density=target, **SMALL)
    st = lay.stats()
    L = 4096
    assert (st["B"], st["Hkv"], st["Lq"], st["Lk"], st["q_block"]) == (1, 2, L, L, 64)
    assert st["n_blocks"] == 64 and st["causal"] is True and st["q_pos0"] == 0
    assert target <= st["density"] <= 1.2 * target, st
    assert st["chunks"] > 8 and 16 <= st["chunk_min"] <= st["chunk_mean"] <= st["chunk_max"] <= 256

    # recompute selected / available and the per-block contract from the ranges
    selected = available = 0
    n_ranges = dense = 0
    for g in range(2):
        for qb in range(64):
            r = lay.ranges(0, g, qb)
            n_ranges += len(r)
            assert r.dtype == np.int64 and r.shape[1] == 2
            assert np.all(r[:, 0] < r[:, 1]) and np.all(r[1:, 0] > r[:-1, 1])  # sorted, disjoint
            assert r.min() >= 0 and r.max() <= L
            keep = np.zeros(L, dtype=bool)
            for s, e in r:
                keep[s:e] = True
            lo, hi = block_span(qb, 64, L, L)
            seen = int(keep[lo:hi].sum())
            for row in range(qb * 64, (qb + 1) * 64):
                selected += int(keep[:row + 1].sum())
                available += row + 1
            if seen == hi - lo:
                dense += 1
                continue
            assert hi - lo >= SMALL["dense_below"]  # smaller blocks are dense
            assert seen >= int(np.ceil(target * (hi - lo))), (g, qb)  # the budget is met
            budget = int(np.ceil(target * (hi - lo)))
            sink = min(SMALL["sink"], budget // 8)  # scale_fixed (default): at most 1/8
            local = min(SMALL["local"], budget // 4)  # and 1/4 of the block's budget
            assert keep[:sink].all(), (g, qb)  # sinks
            assert keep[qb * 64 - local:hi].all(), (g, qb)  # local diagonal
    assert st["ranges"] == n_ranges
    assert st["selected"] == selected and st["available"] == available
    assert st["density"] == pytest.approx(selected / available, rel=1e-12)
    assert st["dense_blocks"] >= 2 * (SMALL["dense_below"] // 64 - 1)
    assert dense >= st["dense_blocks"]


def test_route_methods(work4k):
    q, k, v, _ = work4k
    blk = dhsa.route(q, k, method="block", chunk=128, **SMALL).stats()
    assert blk["chunks"] == 4096 // 128 and blk["chunk_min"] == blk["chunk_max"] == 128
    sim = dhsa.route(q, k, **SMALL).stats()
    assert sim["chunk_min"] != sim["chunk_max"]  # content boundaries
    fixed = dhsa.route(q, k, boundary="fixed", chunk=128, **SMALL)
    block = dhsa.route(q, k, method="block", chunk=128, **SMALL)
    for qb in (10, 40, 63):  # method "block" is "dhsa" with fixed boundaries
        assert np.array_equal(fixed.ranges(0, 1, qb), block.ranges(0, 1, qb))
    # streaming: sinks and the most recent keys, one or two ranges
    stream = dhsa.route(q, k, method="stream", **SMALL)
    r = stream.ranges(0, 0, 63)
    assert r[0, 0] == 0 and r[-1, 1] == 4096 and len(r) <= 2
    orc = dhsa.route(q, k, method="oracle", density=0.125, **SMALL).stats()
    assert 0.125 <= orc["density"] <= 0.15
    # budget= replaces density
    bud = dhsa.route(q, k, budget=512, **SMALL)
    lo, hi = block_span(63, 64, 4096, 4096)
    keep = layout_mask(bud, 2)[0, 0, -1]
    assert 512 <= keep[lo:hi].sum() <= 512 + 256


def test_route_params_object_and_keywords(work):
    q, k, v, _ = work
    p = dhsa.RouterParams(density=0.2, **SMALL)
    a = dhsa.route(q, k, params=p)
    b = dhsa.route(q, k, density=0.2, **SMALL)
    # a keyword replaces the field of params=
    c = dhsa.route(q, k, params=dhsa.RouterParams(density=0.9, **SMALL), density=0.2)
    for qb in range(16):
        assert np.array_equal(a.ranges(0, 1, qb), b.ranges(0, 1, qb))
        assert np.array_equal(a.ranges(0, 1, qb), c.ranges(0, 1, qb))
    lb, wb = dhsa.route_sizes(q, k, params=p)
    assert lb == dhsa.layout_size(1, 2, 1024, 1024, 64, a.max_ranges) and wb > 0


def test_route_does_not_depend_on_threads(work):
    q, k, v, _ = work
    a = dhsa.route(q, k, threads=1, **SMALL)
    b = dhsa.route(q, k, threads=3, **SMALL)
    assert a.stats() == b.stats()
    for g in range(2):
        for qb in range(16):
            assert np.array_equal(a.ranges(0, g, qb), b.ranges(0, g, qb))


def test_route_blhd_views_equal_bhld(work):
    q, k, v, _ = work
    a = dhsa.route(q, k, **SMALL)
    b = dhsa.route(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), layout="BLHD", **SMALL)
    for g in range(2):
        for qb in range(16):
            assert np.array_equal(a.ranges(0, g, qb), b.ranges(0, g, qb))

# ------------------------------------------- sparse attention vs numpy ---


@pytest.mark.parametrize("opts", [
    dict(),
    dict(method="block", chunk=32),
    dict(share_heads=True),
    dict(method="stream", budget=128),
])
def test_sparse_attention_equals_masked_reference(work, ref, close, opts):
    q, k, v, _ = work
    lay = dhsa.route(q, k, density=0.125, **SMALL, **opts)
    assert lay.stats()["density"] < 0.35
    o, lse = dhsa.attention(q, k, v, causal=True, sparse=lay, return_lse=True)
    mask = layout_mask(lay, 4)
    r, rl = ref(q, k, v, causal=True, dense=additive(mask))
    close(o, r, what="o", **F32)
    close(lse, rl, what="lse", **F32)
    # the reference backend honours the layout too
    o2 = dhsa.attention(q, k, v, causal=True, sparse=lay, backend="reference")
    close(o2, r, what="reference backend", **F32)
    # a reference that ignores the layout is wrong
    with pytest.raises(AssertionError):
        close(o, ref(q, k, v, causal=True)[0], **F32)


def test_wrong_head_mapping_of_the_layout_is_detected(work, ref, close):
    q, k, v, _ = work
    # POOLED chunk scores: on this workload MOMENTS (the default) gives both
    # KV heads the same ranges, and the test needs them to differ
    lay = dhsa.route(q, k, density=0.125, score="pooled", **SMALL)
    assert not np.array_equal(layout_mask(lay, 2)[:, 0], layout_mask(lay, 2)[:, 1])  # per KV head
    o = dhsa.attention(q, k, v, causal=True, sparse=lay)
    close(o, ref(q, k, v, causal=True, dense=additive(layout_mask(lay, 4)))[0], **F32)
    m = layout_mask(lay, 2)
    wrong = np.tile(m, (1, 2, 1, 1))  # head h -> KV head h % Hkv
    with pytest.raises(AssertionError):
        close(o, ref(q, k, v, causal=True, dense=additive(wrong))[0], **F32)


def test_sparse_attention_with_masks_window_and_blhd(work, ref, close, rng):
    q, k, v, _ = work
    q, k, v = q[:, :, :512], k[:, :, :768], v[:, :, :768]
    lay = dhsa.route(q, k, q_pos0=256, density=0.25, **SMALL)
    assert lay.stats()["q_pos0"] == 256
    pad = rng.random((1, 768)) < 0.1  # True = ignore
    t = lambda x: x.transpose(0, 2, 1, 3)
    o, lse = dhsa.attention(t(q), t(k), t(v), causal=True, q_pos0=256, window=400, layout="BLHD",
                            key_padding_mask=pad, sparse=lay, return_lse=True)
    r, rl = ref(q, k, v, causal=True, q_pos0=256, window=400, keep=~pad,
                dense=additive(layout_mask(lay, 4)))
    close(t(o), r, what="o", **F32)
    close(lse, rl, what="lse", **F32)


def test_select_all_layout_equals_dense(work, close):
    q, k, v, _ = work
    lay = dhsa.Layout.empty(1, 2, 1024, 1024, 64, 1)
    for g in range(2):
        for qb in range(16):
            lay.set(0, g, qb, [[0, 1024]])
    assert lay.stats()["density"] == 1.0
    o, lse = dhsa.attention(q, k, v, causal=True, sparse=lay, return_lse=True)
    od, lsed = dhsa.attention(q, k, v, causal=True, return_lse=True)
    close(o, od, atol=1e-6, rtol=1e-6)
    close(lse, lsed, atol=1e-6, rtol=1e-6)
    # layout= given a Layout is the same as sparse=
    close(dhsa.attention(q, k, v, causal=True, layout=lay), od, atol=1e-6, rtol=1e-6)
    assert dhsa.workspace_size(q, k, v, causal=True, sparse=lay) > 0

# ------------------------------------------------ hand-made layouts ---


def test_hand_made_layout(qkv, ref, close, rng):
    B, Hq, Hkv, Lq, Lk, qbk = 2, 4, 2, 37, 53, 8
    q, k, v = qkv(B=B, Hq=Hq, Hkv=Hkv, Lq=Lq, Lk=Lk, d=24)
    lay = dhsa.Layout.empty(B, Hkv, Lq, Lk, qbk, 3)
    assert (lay.B, lay.Hkv, lay.Lq, lay.Lk, lay.q_block, lay.n_blocks, lay.max_ranges) == \
        (B, Hkv, Lq, Lk, qbk, 5, 3)
    assert lay.stats()["selected"] == 0 and lay.stats()["ranges"] == 0
    keep = np.zeros((B, Hkv, Lq, Lk), dtype=bool)
    for b in range(B):
        for g in range(Hkv):
            for qb in range(5):
                if (b, g, qb) == (1, 1, 4):
                    continue  # nothing selected: those rows give 0 and -inf
                n = int(rng.integers(1, 4))
                starts = rng.integers(0, Lk, n)
                rs = np.stack([starts, np.minimum(starts + rng.integers(1, 12, n), Lk)], 1)
                lay.set(b, g, qb, rs[::-1])  # any order
                for s, e in rs:
                    keep[b, g, qb * qbk:(qb + 1) * qbk, s:e] = True
    # overlapping and adjacent ranges merge; empty ones vanish
    lay.set(0, 0, 2, [[5, 10], [12, 14], [8, 12], [20, 20]])
    keep[0, 0, 16:24] = False
    keep[0, 0, 16:24, 5:14] = True
    assert lay.ranges(0, 0, 2).tolist() == [[5, 14]]
    assert lay.ranges(1, 1, 4).shape == (0, 2)
    for b, g, row, key in [(0, 0, 17, 4), (0, 0, 17, 5), (0, 0, 17, 13), (0, 0, 17, 14),
                           (1, 0, 36, 0), (1, 1, 33, 7)]:
        assert lay.selects(b, g, row, key) == keep[b, g, row, key], (b, g, row, key)
    st = lay.stats()
    assert st["causal"] is False and st["q_pos0"] == 0 and st["chunks"] == 0
    assert st["available"] == B * Hkv * Lq * Lk and st["selected"] == keep.sum()

    mask = np.repeat(keep, Hq // Hkv, axis=1)
    for opts in (dict(), dict(causal=True, q_pos0=10), dict(window=20, q_pos0=15, softcap=3.0)):
        o, lse = dhsa.attention(q, k, v, sparse=lay, return_lse=True, **opts)
        r, rl = ref(q, k, v, dense=additive(mask), **opts)
        close(o, r, what="o %s" % opts, **F32)
        close(lse, rl, what="lse %s" % opts, **F32)
    o, lse = dhsa.attention(q, k, v, sparse=lay, return_lse=True)
    assert np.all(o[1, 2:, 32:] == 0) and np.all(lse[1, 2:, 32:] == -np.inf)
    assert not np.isnan(o).any()


def test_hand_made_layout_errors_leave_the_block_unchanged():
    lay = dhsa.Layout.empty(1, 2, 37, 53, 8, 2)
    lay.set(0, 1, 3, [[1, 4], [9, 12]])
    with pytest.raises(dhsa.DhsaError, match=r"range 1 is \[50, 54\), outside \[0, Lk=53\)") as e:
        lay.set(0, 1, 3, [[0, 2], [50, 54]])
    assert e.value.name == "DHSA_ERR_INVALID_ARG"
    with pytest.raises(dhsa.DhsaError, match="3 disjoint ranges do not fit max_ranges = 2"):
        lay.set(0, 1, 3, [[0, 2], [5, 7], [9, 11]])
    with pytest.raises(dhsa.DhsaError, match=r"block \(b=0, g=2, qb=0\) is outside the layout"):
        lay.set(0, 2, 0, [[0, 1]])
    with pytest.raises(dhsa.DhsaError, match="outside the layout"):
        lay.ranges(0, 0, 5)
    with pytest.raises(dhsa.DhsaError, match="bad row"):
        lay.selects(0, 0, 37, 0)
    assert lay.ranges(0, 1, 3).tolist() == [[1, 4], [9, 12]]
    lay.set(0, 1, 3, [[0, 2], [2, 5], [4, 9]])  # merges to one range: fits
    assert lay.ranges(0, 1, 3).tolist() == [[0, 9]]
    lay.set(0, 1, 3, [])
    assert lay.ranges(0, 1, 3).shape == (0, 2)
    with pytest.raises(ValueError):
        lay.set(0, 0, 0, [1, 2, 3])
    with pytest.raises(TypeError):
        lay.set(0, 0, 0, [[0.5, 2.0]])
    with pytest.raises(dhsa.DhsaError, match="all must be >= 1"):
        dhsa.Layout.empty(1, 0, 37, 53, 8, 2)
    with pytest.raises(dhsa.DhsaError, match="all must be >= 1"):
        dhsa.layout_size(1, 1, 37, 53, 0, 2)


def test_layout_shape_mismatch_is_a_dhsa_error(qkv):
    q, k, v = qkv(B=2, Hq=4, Hkv=2, Lq=37, Lk=54, d=16)
    lay = dhsa.Layout.empty(2, 2, 37, 53, 8, 1)
    with pytest.raises(dhsa.DhsaError) as e:
        dhsa.attention(q, k, v, sparse=lay)
    assert e.value.name == "DHSA_ERR_SHAPE"
    assert str(e.value) == ("DHSA_ERR_SHAPE: layout was built for B=2 Hkv=2 Lq=37 Lk=53 but the "
                            "call has B=2 Hkv=2 Lq=37 Lk=54")
    q, k, v = qkv(B=2, Hq=4, Hkv=4, Lq=37, Lk=53, d=16)
    with pytest.raises(dhsa.DhsaError, match="Hkv=2 .* but the call has B=2 Hkv=4"):
        dhsa.attention(q, k, v, sparse=lay)
    with pytest.raises(dhsa.DhsaError, match="layout was built for"):
        dhsa.workspace_size(q, k, v, sparse=lay)
    with pytest.raises(TypeError, match="sparse must be a dhsa.Layout"):
        dhsa.attention(q, k, v, sparse="BHLD")
    with pytest.raises(ValueError, match="pass it once"):
        dhsa.attention(q, k, v, layout=lay, sparse=lay)


def test_layout_memory_and_lifetime(qkv):
    c = dhsa.Context(threads=2)
    base = c.mem_stats()["in_use"]
    lay = dhsa.Layout.empty(2, 3, 100, 70, 16, 4, ctx=c)
    assert lay.ctx is c
    assert c.mem_stats()["in_use"] - base == dhsa.layout_size(2, 3, 100, 70, 16, 4)
    lay.close()
    lay.close()  # idempotent
    assert lay.closed and c.mem_stats()["in_use"] == base
    with pytest.raises(ValueError, match="closed"):
        lay.ranges(0, 0, 0)
    # a budget holds layouts too
    c.set_budget(base + 1000)
    with pytest.raises(dhsa.DhsaError, match="memory budget exceeded"):
        dhsa.Layout.empty(2, 3, 100, 70, 16, 4, ctx=c)
    c.set_budget(0)
    # closing the context closes what was allocated from it
    with c:
        a = dhsa.Layout.empty(1, 1, 10, 10, 5, 1)  # on c: the current context
        ix = dhsa.KVIndex(1, 8, 100)
        assert a.ctx is c and ix.ctx is c
    assert c.closed and a.closed and ix.closed
    with pytest.raises(ValueError, match="its context was closed"):
        a.stats()
    q, k, v = qkv(B=1, Hq=1, Hkv=1, Lq=10, Lk=10, d=8)
    with pytest.raises(ValueError, match="closed"):
        dhsa.attention(q, k, v, sparse=a)
    with pytest.raises(ValueError, match="closed"):
        ix.append(k)
    # a `with` block closes a layout
    with dhsa.Layout.empty(1, 1, 10, 10, 5, 1) as b:
        b.set(0, 0, 0, [[0, 3]])
    assert b.closed

# ------------------------------------------------ router param errors ---


def test_bad_router_params_raise_the_c_sentence(work):
    q, k, v, _ = work
    cases = [
        (dict(density=0.0), "density = 0: give budget_tokens > 0 or a density in (0, 1]"),
        (dict(density=1.5), "density = 1.5: give budget_tokens > 0"),
        (dict(q_block=0), "q_block = 0: use 1..2^20"),
        (dict(min_chunk=64, max_chunk=32), "chunk sizes: need chunk >= 1, 1 <= min_chunk <= "
                                           "max_chunk"),
        (dict(sim_window=0), "w 0"),
        (dict(sink=-1), "budget, sink, local and dense_below must be >= 0"),
        (dict(budget=-5), "budget, sink, local and dense_below must be >= 0"),
        (dict(threshold=float("nan")), "threshold must be finite"),
    ]
    for kw, sentence in cases:
        with pytest.raises(dhsa.DhsaError) as e:
            dhsa.route(q, k, **kw)
        assert e.value.name == "DHSA_ERR_INVALID_ARG", kw
        assert sentence in e.value.message, (kw, e.value.message)
        with pytest.raises(dhsa.DhsaError):
            dhsa.route_sizes(q, k, **kw)
    pr = dhsa.Predictor.random(64, w=2, hidden=8)
    with pytest.raises(dhsa.DhsaError,
                       match=r"learned_threshold must be a probability in \[0, 1\]"):
        dhsa.route(q, k, boundary=pr, learned_threshold=1.5)
    # the attention checks apply to the routed call
    with pytest.raises(dhsa.DhsaError, match="not a multiple of"):
        dhsa.route(q[:, :3], k)
    # what Python must understand itself
    with pytest.raises(ValueError, match="method must be"):
        dhsa.route(q, k, method="dense")
    with pytest.raises(ValueError, match="boundary must be"):
        dhsa.route(q, k, boundary="learned")
    with pytest.raises(ValueError, match="method='block' means fixed boundaries"):
        dhsa.route(q, k, method="block", boundary="similarity")
    with pytest.raises(TypeError, match="'densty'"):
        dhsa.route(q, k, densty=0.1)
    with pytest.raises(TypeError, match="chunk must be an integer"):
        dhsa.route(q, k, chunk=64.0)
    with pytest.raises(ValueError, match="layout must be"):
        dhsa.route(q, k, layout="BLDH")

# ------------------------------------------------------------ KV index ---


KV = dict(density=0.125, **SMALL)


def test_kv_index_incremental_equals_one_shot(work, rng):
    q, k, v, _ = work
    one = dhsa.KVIndex(2, 32, 1024, **KV)
    one.append(k)
    inc = dhsa.KVIndex(2, 32, 1024, **KV)
    pos = 0
    t = lambda x: x.transpose(0, 2, 1, 3)
    while pos < 1024:
        n = int(rng.integers(1, 150))
        piece = k[:, :, pos:pos + n]
        if n % 2:
            inc.append(t(piece), layout="BLHD")  # batch-first views too
        else:
            inc.append(piece)
        pos += n
        assert inc.length == min(pos, 1024)
    assert one.length == inc.length == len(inc) == 1024
    c1, c2 = one.chunks(), inc.chunks()
    assert c1.dtype == np.int64 and len(c1) > 3
    assert np.array_equal(c1, c2)
    assert c1[0] == 0 and np.all(np.diff(c1) >= KV.get("min_chunk", 16))
    a, b = one.route(q, k, 0), inc.route(q, k, 0)
    assert a.stats() == b.stats()
    for g in range(2):
        for qb in range(16):
            assert np.array_equal(a.ranges(0, g, qb), b.ranges(0, g, qb))


def test_kv_index_ubatch_routing_equals_routing_once(work):
    q, k, v, _ = work
    once = dhsa.KVIndex(2, 32, 1024, **KV)
    once.append(k)
    full = once.route(q, k, 0)
    ix = dhsa.KVIndex(2, 32, 1024, **KV)
    for s in range(0, 1024, 256):
        ix.append(k[:, :, s:s + 256])
        part = ix.route(q[:, :, s:s + 256], k[:, :, :s + 256])  # q_pos0 = length - Lq = s
        assert part.stats()["q_pos0"] == s
        for g in range(2):
            for qb in range(4):
                assert np.array_equal(part.ranges(0, g, qb), full.ranges(0, g, s // 64 + qb))


def test_kv_index_decode_layout_equals_masked_reference(work, ref, close):
    q, k, v, _ = work
    ix = dhsa.KVIndex(2, 32, 2048, **KV)
    ix.append(k)
    qd = q[:, :, -3:]  # the three newest rows
    lay = ix.route(qd, k)
    assert lay.stats()["q_pos0"] == 1021 and lay.stats()["density"] < 0.3
    o = dhsa.attention(qd, k, v, causal=True, q_pos0=1021, sparse=lay)
    r = ref(qd, k, v, causal=True, q_pos0=1021, dense=additive(layout_mask(lay, 4)))[0]
    close(o, r, **F32)
    with pytest.raises(AssertionError):
        close(o, ref(qd, k, v, causal=True, q_pos0=1021)[0], **F32)


def test_kv_index_fixed_boundaries_and_errors(work):
    q, k, v, _ = work
    ix = dhsa.KVIndex(2, 32, 300, method="block", chunk=64, **SMALL)
    ix.append(k[:, :, :200])
    assert ix.chunks().tolist() == [0, 64, 128]
    with pytest.raises(dhsa.DhsaError,
                       match="appending 101 keys to 200 exceeds the capacity 300") as e:
        ix.append(k[:, :, 200:301])
    assert e.value.name == "DHSA_ERR_TOO_LARGE" and ix.length == 200
    with pytest.raises(dhsa.DhsaError,
                       match=r"keys are \[1, 1, 5, 32\], the index wants \[1, 2, n, 32\]"):
        ix.append(k[:, :1, :5])
    with pytest.raises(dhsa.DhsaError, match="the index holds 200 keys"):
        ix.route(q[:, :, :10], k[:, :, :210], 0)
    with pytest.raises(dhsa.DhsaError,
                       match="the decode index routes with the DHSA method only") as e:
        dhsa.KVIndex(2, 32, 100, method="stream")
    assert e.value.name == "DHSA_ERR_UNSUPPORTED"
    with pytest.raises(dhsa.DhsaError, match="the predictor reads C = 48 features per token but the "
                                             "index holds 2 KV heads x 32 dims = 64") as e:
        dhsa.KVIndex(2, 32, 100, boundary=dhsa.Predictor.random(48, w=2, hidden=8))
    assert e.value.name == "DHSA_ERR_SHAPE"
    with pytest.raises(dhsa.DhsaError, match="index sizes Hkv=2 d=32 capacity=0"):
        dhsa.KVIndex(2, 32, 0)
    with pytest.raises(dhsa.DhsaError, match="q_block = 0"):
        dhsa.KVIndex(2, 32, 100, q_block=0)



def test_kv_index_learned(work):
    """Learned boundaries in the index: the predictor runs as keys arrive;
    one key at a time, odd ubatches and one call close the same chunks."""
    q, k, v, _ = work
    pr = dhsa.Predictor.random(64, w=4, hidden=16, seed=3)
    thr = float(np.quantile(pr.score(k)[1:], 0.7))
    kw = dict(boundary=pr, learned_threshold=thr, min_chunk=8, max_chunk=64, nms_window=4, **SMALL)
    whole = dhsa.KVIndex(2, 32, 1024, **kw)
    whole.append(k)
    one = dhsa.KVIndex(2, 32, 1024, **kw)
    for t in range(1024):
        one.append(k[:, :, t:t + 1])
    odd = dhsa.KVIndex(2, 32, 1024, **kw)
    for t0 in range(0, 1024, 77):
        odd.append(k[:, :, t0:t0 + 77])
    c = whole.chunks()
    assert len(c) >= 8 and c[0] == 0 and np.all(np.diff(c) >= 8) and np.all(np.diff(c) <= 64)
    assert np.array_equal(one.chunks(), c) and np.array_equal(odd.chunks(), c)
    other = dhsa.KVIndex(2, 32, 1024, **dict(kw, learned_threshold=float(np.quantile(pr.score(k)[1:], 0.95))))
    other.append(k)
    assert not np.array_equal(other.chunks(), c)
    ix = dhsa.KVIndex(2, 32, 1024, **kw)
    pr.close()
    with pytest.raises(ValueError, match="closed"):
        ix.append(k[:, :, :4])


# ----------------------------------------------------------- predictor ---


def test_predictor_round_trip_and_score(work, tmp_path):
    q, k, v, _ = work
    pr = dhsa.Predictor.random(64, w=4, hidden=32, seed=7)
    assert (pr.width, pr.window) == (64, 4)
    p = pr.score(k)
    assert p.shape == (1024,) and p.dtype == np.float32
    assert p[0] == 0 and np.all((p >= 0) & (p <= 1)) and np.isfinite(p).all()
    assert np.array_equal(pr.score(k.transpose(0, 2, 1, 3), layout="BLHD"), p)
    path = tmp_path / "pred.bin"
    pr.save(path)
    data = path.read_bytes()
    assert data[:8] == b"DHSAPRD1"
    back = dhsa.Predictor.load(str(path))
    assert (back.width, back.window) == (64, 4)
    assert np.array_equal(back.score(k), p)
    assert np.array_equal(dhsa.Predictor.from_bytes(data).score(k), p)
    assert not np.array_equal(dhsa.Predictor.random(64, w=4, hidden=32, seed=8).score(k), p)
    # learned boundaries drive the router
    lay = dhsa.route(q, k, boundary=pr, learned_threshold=float(np.quantile(p[1:], 0.9)), **SMALL)
    assert lay.stats()["chunks"] >= 2
    pr.close()
    with pytest.raises(ValueError, match="closed"):
        dhsa.route(q, k, boundary=pr)


def test_predictor_errors(work, tmp_path):
    q, k, v, _ = work
    pr = dhsa.Predictor.random(48, w=2, hidden=8)
    with pytest.raises(dhsa.DhsaError, match="the predictor reads C = 48 features per token but k "
                                             "has 2 KV heads x 32 dims = 64") as e:
        pr.score(k)
    assert e.value.name == "DHSA_ERR_SHAPE"
    with pytest.raises(dhsa.DhsaError, match="batch 1 is outside k"):
        dhsa.Predictor.random(64, w=2, hidden=8).score(k, b=1)
    with pytest.raises(dhsa.DhsaError, match="cannot open predictor file") as e:
        dhsa.Predictor.load(tmp_path / "missing.bin")
    assert e.value.name == "DHSA_ERR_IO"
    path = tmp_path / "p.bin"
    pr.save(path)
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    with pytest.raises(dhsa.DhsaError, match="CRC-32") as e:
        dhsa.Predictor.from_bytes(bytes(data))
    assert e.value.name == "DHSA_ERR_FORMAT"
    with pytest.raises(dhsa.DhsaError, match="magic"):
        dhsa.Predictor.from_bytes(b"NOTAPRED" + bytes(40))
    with pytest.raises(TypeError):
        dhsa.Predictor(0)

# ------------------------------------------------------------ fidelity ---


def test_fidelity(work):
    q, k, v, _ = work
    od, ld = dhsa.attention(q, k, v, causal=True, return_lse=True)
    f = dhsa.fidelity(od, ld, od, ld)
    assert f == {"recall": 1.0, "recall_min": 1.0, "rel_err": 0.0, "rows": 4 * 1024}
    lay = dhsa.route(q, k, density=0.125, **SMALL)
    os_, ls = dhsa.attention(q, k, v, causal=True, sparse=lay, return_lse=True)
    f = dhsa.fidelity(od, ld, os_, ls)
    r = np.minimum(np.exp(ls.astype(np.float64) - ld), 1.0)
    assert f["rows"] == 4096
    assert f["recall"] == pytest.approx(r.mean(), rel=1e-9)
    assert f["recall_min"] == pytest.approx(r.min(), rel=1e-9)
    od64 = od.astype(np.float64)
    rel = np.linalg.norm((os_ - od64).ravel()) / np.linalg.norm(od64.ravel())
    assert f["rel_err"] == pytest.approx(rel, rel=1e-9)
    assert 0 < f["recall"] < 1 and f["rel_err"] > 0
    # BLHD outputs, and lse as [B, H, L, 1]
    t = lambda x: x.transpose(0, 2, 1, 3)
    g = dhsa.fidelity(t(od), ld[..., None], t(os_), ls[..., None], layout="BLHD")
    assert g == f
    with pytest.raises(dhsa.DhsaError, match="dense and sparse outputs differ in shape"):
        dhsa.fidelity(od, ld, os_[:, :, :10], ls[:, :, :10])
    with pytest.raises(ValueError, match="lse_dense must be"):
        dhsa.fidelity(od, ld[..., None, None], os_, ls)


def test_kv_index_bounds_and_exact_route():
    """bounds() is chunks() with the last closed chunk's end; route(exact=True)
    (dhsa_kv_index_route_exact) gives a layout of the same shape that can
    differ from the estimate's, and refuses share_heads."""
    rng = np.random.default_rng(4)
    Hkv, d, L = 2, 16, 300
    k = rng.standard_normal((1, Hkv, L, d)).astype(np.float32)
    q = rng.standard_normal((1, 4, L, d)).astype(np.float32)
    t = q[:, ::2, -8:].mean(2)
    t /= np.linalg.norm(t, axis=-1, keepdims=True)
    k[:, :, 30:60] -= 0.9 * t[:, :, None]
    k[:, :, 44] = 3.0 * t  # a key the last rows attend, hidden among keys that point away
    p = dhsa.RouterParams.for_length(L)
    with dhsa.KVIndex(Hkv, d, L, params=p) as ix:
        ix.append(k)
        c, b = ix.chunks(), ix.bounds()
        assert len(b) == len(c) + 1 and (b[:-1] == c).all() and c[-1] < b[-1] <= L
        le = ix.route(q[:, :, 192:], k, 192)
        lx = ix.route(q[:, :, 192:], k, 192, exact=True)
        assert (lx.n_blocks, lx.q_block) == (le.n_blocks, le.q_block)
        diff = sum(lx.ranges(0, g, i).tolist() != le.ranges(0, g, i).tolist()
                   for g in range(Hkv) for i in range(lx.n_blocks))
        assert diff > 0
    with dhsa.KVIndex(Hkv, d, L, params=p, share_heads=True) as ix:
        ix.append(k)
        with pytest.raises(dhsa.DhsaError, match="share_heads"):
            ix.route(q[:, :, 192:], k, 192, exact=True)


def test_kv_index_carry_and_keep():
    """carry() (dhsa_kv_index_carry) gives [Hkv, DHSA_CARRY_MAX] chunk
    numbers, the largest share first: the chunk of a key the row points
    at comes first; masked out (attn_mask False / key_padding_mask True)
    it is not carried. route(keep=) (dhsa_kv_index_route_keep) reads the
    kept chunks; its arguments are checked. (The shares against a float64
    reference: tests/test_carry.c.)"""
    rng = np.random.default_rng(5)
    Hkv, d, L = 2, 16, 600
    with open(os.path.join(REPO, "include", "dhsa", "route.h")) as f:
        assert _capi.DHSA_CARRY_MAX == int(re.search(r"#define DHSA_CARRY_MAX (\d+)", f.read()).group(1))
    k = rng.standard_normal((1, Hkv, L, d)).astype(np.float32)
    t = rng.standard_normal((Hkv, d)).astype(np.float32)
    t /= np.linalg.norm(t, axis=-1, keepdims=True)
    k[0, :, 300] = 12.0 * t
    q = np.repeat(3.0 * t, 2, axis=0)[None, :, None, :].astype(np.float32)
    p = dataclasses.replace(dhsa.RouterParams.for_length(L), causal_boundaries=True)
    with dhsa.KVIndex(Hkv, d, L, params=p) as ix:
        ix.append(k)
        b = ix.bounds()
        lay = ix.route(q, k)
        got = ix.carry(q, k, lay, 0.1, scale=0.25)
        assert got.shape == (Hkv, _capi.DHSA_CARRY_MAX) and got.dtype == np.int64
        assert all(b[got[g, 0]] <= 300 < b[got[g, 0] + 1] for g in range(Hkv)), got
        hide = np.ones((1, L), dtype=bool)
        hide[0, b[got[0, 0]]:b[got[0, 0] + 1]] = False
        for kw in (dict(attn_mask=hide), dict(key_padding_mask=~hide)):
            masked = ix.carry(q, k, lay, 0.1, scale=0.25, **kw)
            assert got[0, 0] not in masked[0], (kw, masked)
        assert (ix.carry(q, k, lay, 0.0) == -1).all()
        # the exact ranking scores with the attention's scale (None and 0 in C:
        # 1/sqrt(d)); it reads the chunk that holds the row's attention
        lx, lx2 = ix.route(q, k, exact=True), ix.route(q, k, exact=True, scale=d ** -0.5)
        assert all(lx.selects(0, g, 0, 300) == 1 for g in range(Hkv))
        assert all(lx.ranges(0, g, 0).tolist() == lx2.ranges(0, g, 0).tolist() for g in range(Hkv))
        lx.close()
        lx2.close()
        q2 = (-q + 0.3 * rng.standard_normal(q.shape)).astype(np.float32)
        kept, plain = ix.route(q2, k, keep=got), ix.route(q2, k)
        c = got[0, 0]
        assert kept.selects(0, 0, 0, int(b[c])) == 1
        assert kept.ranges(0, 0, 0).tolist() != plain.ranges(0, 0, 0).tolist()
        with pytest.raises(ValueError, match="keep must be"):
            ix.route(q2, k, keep=got[:1])
        with pytest.raises(ValueError, match="exact=True and keep="):
            ix.route(q2, k, exact=True, keep=got)
        with pytest.raises(dhsa.DhsaError, match="share"):
            ix.carry(q, k, lay, 1.5)
        with pytest.raises(ValueError, match="scale"):
            ix.carry(q, k, lay, 0.1, scale=0)
        with pytest.raises(TypeError, match="Layout"):
            ix.carry(q, k, got, 0.1)
        for x in (lay, kept, plain):
            x.close()
