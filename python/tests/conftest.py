"""conftest.py: shared fixtures for the dhsa Python tests: a seeded random
generator, an independent float64 numpy reference attention, and a
comparison helper that fails loudly (worst element, where, NMSE).

The reference is written here from the semantics in include/dhsa.h and
docs/attention.md, not from the C code. It takes masks in its own explicit
form (keep = True where a key takes part, bias added per key, dense added per
score), so each test states by hand what a PyTorch-named mask must mean:
that is where a polarity mistake in the binding would show.

Run: PYTHONPATH=python DHSA_LIB=build/libdhsa.so python3 -m pytest -q python/tests
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "python") not in sys.path:  # so a bare `pytest python/tests` works too
    sys.path.insert(0, str(REPO / "python"))
if "DHSA_LIB" not in os.environ and (REPO / "build" / "libdhsa.so").exists():
    os.environ["DHSA_LIB"] = str(REPO / "build" / "libdhsa.so")


def reference_attention(q, k, v, *, scale=None, softcap=0.0, causal=False, window=0, q_pos0=0,
                        keep=None, bias=None, dense=None):
    """Attention in float64, materialising the scores.

    q [B, Hq, Lq, d], k [B, Hkv, Lk, d], v [B, Hkv, Lk, dv] (BHLD); query
    head h reads K/V head h // (Hq // Hkv).
    keep: [B|1, Lk] bool, True = the key takes part. bias: [B|1, Lk] added.
    dense: anything broadcastable to [B, Hq, Lq, Lk], added.
    Returns (o [B, Hq, Lq, dv], lse [B, Hq, Lq]); a row with no allowed key
    gives o = 0, lse = -inf."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, Hq, Lq, d = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    g = Hq // Hkv
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * (1.0 / np.sqrt(d) if scale is None else scale)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)[:, None, None, :]
    if dense is not None:
        s = s + np.asarray(dense, dtype=np.float64)
    allowed = np.ones(s.shape, dtype=bool)
    if keep is not None:
        allowed &= np.asarray(keep, dtype=bool)[:, None, None, :]
    i = q_pos0 + np.arange(Lq)[:, None]
    j = np.arange(Lk)[None, :]
    if causal:
        allowed &= j <= i
    if window:
        allowed &= j > i - window
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if Lk else np.full(s.shape[:-1] + (1,), -np.inf)
    empty = m == -np.inf
    m = np.where(empty, 0.0, m)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    o = (p @ v) / np.where(l == 0, 1.0, l)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(l))[..., 0]
    return o, lse


def assert_close(got, ref, *, atol, rtol, what="result"):
    """|got - ref| <= atol + rtol * |ref| per element; NaN must match NaN,
    +-inf must match exactly. On failure the message names how many
    elements fail, the worst one, where, and the NMSE."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, "%s: shape %s, reference %s" % (what, got.shape, ref.shape)
    fin = np.isfinite(ref)
    with np.errstate(invalid="ignore"):
        err = np.where(fin, np.abs(got - ref), 0.0)
    tol = atol + rtol * np.abs(np.where(fin, ref, 0.0))
    bad = np.isnan(got) != np.isnan(ref)
    bad |= np.isinf(ref) & (got != ref)
    bad |= fin & ~(err <= tol)  # catches NaN in got where ref is finite
    if bad.any():
        excess = np.where(bad, np.nan_to_num(err - tol, nan=np.inf, posinf=np.inf), -np.inf)
        where = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), ref.shape))
        with np.errstate(invalid="ignore", over="ignore"):
            denom = float(np.sum(np.where(fin, ref, 0.0) ** 2)) or 1.0
            nmse = float(np.sum(np.where(fin, got - ref, 0.0) ** 2)) / denom
        raise AssertionError(
            "%s: %d of %d elements out of tolerance (atol %g, rtol %g); worst at %s: got %r, "
            "reference %r; NMSE %.3g" % (what, int(bad.sum()), bad.size, atol, rtol, where,
                                         float(got[where]), float(ref[where]), nmse))


@pytest.fixture
def rng():
    return np.random.default_rng(20240601)


@pytest.fixture
def ref():
    return reference_attention


@pytest.fixture
def close():
    return assert_close


@pytest.fixture
def qkv(rng):
    """make(B, Hq, Hkv, Lq, Lk, d, dv=None, dtype=float32) -> q, k, v (BHLD)."""
    def make(B=2, Hq=4, Hkv=2, Lq=37, Lk=53, d=24, dv=None, dtype=np.float32):
        dv = d if dv is None else dv
        q = rng.standard_normal((B, Hq, Lq, d)).astype(dtype)
        k = rng.standard_normal((B, Hkv, Lk, d)).astype(dtype)
        v = rng.standard_normal((B, Hkv, Lk, dv)).astype(dtype)
        return q, k, v
    return make
