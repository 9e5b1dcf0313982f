"""test_api.py: errors (DhsaError with the C sentence, Python argument
errors), contexts (budget, statistics, context manager, threads), the exact
workspace query, process peak RSS, that the comparison helper can fail, and
that examples/mha_memory.py runs (and refuses torch modes without torch).
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import dhsa
from conftest import REPO

F32 = dict(atol=2e-5, rtol=1e-4)

# ----------------------------------------------------------------- errors ---


def test_c_errors_raise_dhsa_error_with_the_sentence(rng):
    q = rng.standard_normal((1, 6, 5, 8)).astype(np.float32)
    kv = rng.standard_normal((1, 4, 7, 8)).astype(np.float32)
    with pytest.raises(dhsa.DhsaError) as e:
        dhsa.attention(q, kv, kv)
    assert str(e.value) == "DHSA_ERR_SHAPE: q has 6 heads, not a multiple of k's 4"
    assert e.value.name == "DHSA_ERR_SHAPE" and e.value.status == -2
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(dhsa.DhsaError, match="DHSA_ERR_SHAPE: q has dim 8 but k has 6"):
        dhsa.attention(q[:, :4], kv[..., :6], kv)
    with pytest.raises(dhsa.DhsaError, match="DHSA_ERR_INVALID_ARG: window = -1"):
        dhsa.attention(q, q, q, window=-1)
    with pytest.raises(dhsa.DhsaError, match="DHSA_ERR_INVALID_ARG: q_pos0 = -3"):
        dhsa.attention(q, q, q, q_pos0=-3)
    with pytest.raises(dhsa.DhsaError, match="DHSA_ERR_INVALID_ARG: softcap"):
        dhsa.attention(q, q, q, softcap=-1.0)
    with pytest.raises(dhsa.DhsaError, match="DHSA_ERR_TOO_LARGE: the reference backend"):
        dhsa.attention(q, q, q, backend="reference", reference_max_bytes=16)


def test_check_finite_names_the_element(rng):
    q = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    k = q.copy()
    k[0, 1, 3, 2] = np.nan
    with pytest.raises(dhsa.DhsaError, match=r"DHSA_ERR_NONFINITE: k\[0, 1, 3, 2\]"):
        dhsa.attention(q, k, q, check_finite=True)


def test_python_argument_errors(rng):
    q = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    with pytest.raises(TypeError, match="q has dtype float64"):
        dhsa.attention(q.astype(np.float64), q, q)
    with pytest.raises(ValueError, match="must be 4-D"):
        dhsa.attention(q[0], q, q)
    with pytest.raises(ValueError, match="layout must be"):
        dhsa.attention(q, q, q, layout="BSHD")
    with pytest.raises(ValueError, match="backend must be"):
        dhsa.attention(q, q, q, backend="flash")
    with pytest.raises(ValueError, match="scale = 0"):
        dhsa.attention(q, q, q, scale=0.0)
    with pytest.raises(ValueError, match="int64"):
        dhsa.attention(q, q, q, window=2**70)

# ---------------------------------------------------------------- context ---


def test_memory_budget_too_small_fails_before_work(rng):
    q = rng.standard_normal((1, 4, 100, 32)).astype(np.float32)
    need = dhsa.workspace_size(q, q, q, threads=2)
    with dhsa.Context(threads=2, mem_budget=need - 1) as c:
        with pytest.raises(dhsa.DhsaError) as e:
            dhsa.attention(q, q, q)  # runs on c: the innermost `with` context
        assert e.value.name == "DHSA_ERR_MEMORY_BUDGET"
        assert "budget %d" % (need - 1) in e.value.message
        assert c.mem_stats()["in_use"] == 0
    with dhsa.Context(threads=2, mem_budget=need) as c:
        dhsa.attention(q, q, q)
        s = c.mem_stats()
        assert s["in_use"] == need and s["peak"] == need and s["budget"] == need
    assert c.closed


def test_workspace_size_is_exact_and_context_statistics(rng):
    q = rng.standard_normal((2, 8, 77, 24)).astype(np.float16)
    kv = rng.standard_normal((2, 2, 90, 24)).astype(np.float16)
    am = rng.random((77, 90)) < 0.5
    c = dhsa.Context(threads=3)
    try:
        assert c.n_threads == 3
        n = dhsa.workspace_size(q, kv, kv, attn_mask=am, ctx=c)
        assert n > 0 and c.mem_stats() == {"in_use": 0, "peak": 0, "largest": 0, "n_allocs": 0,
                                           "budget": 0}
        dhsa.attention(q, kv, kv, attn_mask=am, ctx=c)
        s = c.mem_stats()
        assert s["in_use"] == n and s["peak"] == n and s["largest"] == n and s["n_allocs"] == 1
        c.trim()
        assert c.mem_stats()["in_use"] == 0
        c.reset_peak()
        assert c.mem_stats()["peak"] == 0
        c.set_budget(1000)
        with pytest.raises(dhsa.DhsaError, match="DHSA_ERR_MEMORY_BUDGET"):
            dhsa.attention(q, kv, kv, ctx=c)
        assert "budget=1000" in repr(c)
    finally:
        c.close()
    with pytest.raises(ValueError, match="closed"):
        dhsa.attention(q, kv, kv, ctx=c)
    with pytest.raises(ValueError, match="disagrees"):
        dhsa.attention(q, kv, kv, ctx=dhsa.default_context(), threads=10**4)


def test_default_context_and_module_mem_stats(rng):
    q = rng.standard_normal((1, 2, 9, 8)).astype(np.float32)
    dhsa.attention(q, q, q)
    assert dhsa.mem_stats() == dhsa.default_context().mem_stats()
    assert dhsa.mem_stats()["in_use"] >= dhsa.workspace_size(q, q, q)
    assert dhsa.default_context().n_threads == os.cpu_count() or os.cpu_count() is None


def test_context_arguments_checked():
    with pytest.raises(dhsa.DhsaError, match="n_threads = 5000"):
        dhsa.Context(threads=5000)
    with pytest.raises(ValueError, match="mem_budget"):
        dhsa.Context(mem_budget=-1)

# ------------------------------------------------------------ process RSS ---


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
def test_peak_rss_sees_a_touched_allocation():
    dhsa.reset_peak_rss()
    before = dhsa.peak_rss()
    a = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, touched
    del a
    after = dhsa.peak_rss()
    assert after - before >= 60 << 20
    assert dhsa.rss() <= after
    dhsa.reset_peak_rss()
    assert dhsa.peak_rss() < after

# ------------------------------------------------- the helper can fail ---


def test_deliberately_wrong_reference_is_detected(qkv, ref, close):
    q, k, v = qkv(B=1, Hq=2, Hkv=2, Lq=15, Lk=20, d=8)
    o, lse = dhsa.attention(q, k, v, causal=True, return_lse=True)
    close(o, ref(q, k, v, causal=True)[0], **F32)
    with pytest.raises(AssertionError, match="out of tolerance"):
        close(o, ref(q, k, v, causal=False)[0], **F32)          # wrong mask
    with pytest.raises(AssertionError):
        close(o, ref(q, k, v, causal=True, scale=0.3)[0], **F32)  # wrong scale
    bad = o.copy()
    bad[0, 1, 7, 3] += 1e-3                                       # one element off
    with pytest.raises(AssertionError, match=r"worst at \(0, 1, 7, 3\)"):
        close(bad, o, **F32)
    bad[0, 1, 7, 3] = np.nan
    with pytest.raises(AssertionError):
        close(bad, o, **F32)
    with pytest.raises(AssertionError):
        close(np.zeros_like(lse), lse, **F32)                     # -inf rows must match too
    masked = ref(q, k, v, keep=np.zeros((1, 20), bool))[1]
    with pytest.raises(AssertionError):
        close(np.zeros_like(masked), masked, **F32)

# ---------------------------------------------------------------- example ---


def _run_example(args, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"),
                                                      (env_extra or {}).get("PYTHONPATH")]))
    return subprocess.run([sys.executable, str(REPO / "examples" / "mha_memory.py")] + args,
                          capture_output=True, text=True, env=env, timeout=120)


def test_example_dhsa_mode_runs():
    r = _run_example(["dhsa", "256"])
    assert r.returncode == 0, r.stderr
    assert "peak_rss_bytes" in r.stdout


def test_example_torch_modes_without_torch_exit_3(tmp_path):
    # Hide any installed torch behind a module that fails to import.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('hidden for the test')\n")
    for mode in ("torch", "compare"):
        r = _run_example([mode, "64"], {"PYTHONPATH": str(tmp_path)})
        assert r.returncode == 3, (mode, r.returncode, r.stderr)
        assert "PyTorch" in r.stderr


def test_example_bad_arguments():
    r = _run_example(["dhsa"])
    assert r.returncode == 2 and "usage" in r.stderr
