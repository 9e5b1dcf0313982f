"""test_capi.py: the ctypes layer matches include/dhsa.h.

Three independent checks of the struct mirrors: sizes against the LP64
values computed by hand, every field offset against a C program compiled
from the header (skipped without a C compiler), and a behavioural check that
each descriptor field set from Python reaches C where C expects it (C echoes
the value in its error sentence).
"""

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

import dhsa
from dhsa import _capi
from conftest import REPO

LP64 = ctypes.sizeof(ctypes.c_void_p) == 8 and ctypes.sizeof(ctypes.c_long) == 8
STRUCTS = {"Tensor": ("dhsa_tensor", _capi.Tensor), "AttnDesc": ("dhsa_attn_desc", _capi.AttnDesc),
           "CtxParams": ("dhsa_ctx_params", _capi.CtxParams),
           "MemStats": ("dhsa_mem_stats", _capi.MemStats),
           "RouterParams": ("dhsa_router_params", _capi.RouterParams)}


def test_library_loads_and_names_statuses():
    assert dhsa.lib_path()
    L = _capi.lib()
    assert L.dhsa_status_str(-2) == b"DHSA_ERR_SHAPE"
    assert L.dhsa_status_str(-4) == b"DHSA_ERR_MEMORY_BUDGET"


@pytest.mark.skipif(not LP64, reason="sizes computed for LP64")
def test_struct_sizes_lp64():
    for name, (_, cls) in STRUCTS.items():
        assert ctypes.sizeof(cls) == _capi.LP64_SIZES[name], name


def test_struct_offsets_match_compiled_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "dhsa.h"', "int main(void) {"]
    for _, (cname, cls) in STRUCTS.items():
        lines.append('printf("%s sizeof %%zu\\n", sizeof(%s));' % (cname, cname))
        for field, _ in cls._fields_:
            lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));' % (cname, field, cname, field))
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", str(REPO / "include"), str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    got = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        struct, field, value = line.split()
        got[(struct, field)] = int(value)
    for _, (cname, cls) in STRUCTS.items():
        assert got[(cname, "sizeof")] == ctypes.sizeof(cls), cname
        for field, _ in cls._fields_:
            assert got[(cname, field)] == getattr(cls, field).offset, "%s.%s" % (cname, field)


def test_tensor_constructors_fill_fields_where_ctypes_reads_them():
    L = _capi.lib()
    t = L.dhsa_tensor_blhd(ctypes.c_void_p(0x1000), _capi.DHSA_F16, 2, 3, 5, 7)  # B L H D
    assert t.data == 0x1000 and t.type == _capi.DHSA_F16
    assert list(t.shape) == [2, 5, 3, 7]
    assert list(t.stride) == [3 * 5 * 7, 7, 5 * 7, 1]
    d = L.dhsa_attn_default_desc()
    assert d.backend == _capi.DHSA_BACKEND_AUTO and d.key_mask is None and d.scale == 0.0


def _desc_error(**fields):
    """Error sentence of dhsa_attention on a valid small problem with some
    descriptor fields overwritten."""
    q = np.zeros((1, 2, 3, 4), np.float32)
    desc, keep, _, _ = dhsa._attention._build(
        q, q, q, causal=False, scale=None, key_padding_mask=None, attn_mask=None, window=0,
        softcap=0.0, layout="BHLD", backend=None, q_pos0=0, return_lse=True, dtype=None,
        check_finite=False, reference_max_bytes=None, query_only=False)
    for name, value in fields.items():
        obj, attr = desc, name
        while "." in attr:
            head, attr = attr.split(".", 1)
            obj = getattr(obj, head)
        if "[" in attr:
            attr, idx = attr[:-1].split("[")
            getattr(obj, attr)[int(idx)] = value
        else:
            setattr(obj, attr, value)
    c = dhsa.default_context()
    with pytest.raises(dhsa.DhsaError) as e:
        with c._lock:
            _capi.check(_capi.lib().dhsa_attention(c._live_handle(), ctypes.byref(desc)))
    del keep
    return str(e.value)


def test_each_descriptor_field_reaches_c():
    assert "q_pos0 = -7" in _desc_error(q_pos0=-7)
    assert "window = -5" in _desc_error(window=-5)
    assert "softcap must be finite and >= 0" in _desc_error(softcap=-2.0)
    assert "scale must be finite" in _desc_error(scale=float("inf"))
    assert "unknown backend 9" in _desc_error(backend=9)
    msg = _desc_error(key_mask=0x10, key_mask_polarity=0)
    assert "without a polarity" in msg
    assert "key_mask_batch_stride must be >= 0" in _desc_error(
        key_mask=0x10, key_mask_polarity=1, key_mask_batch_stride=-1)
    assert "key_bias_batch_stride must be >= 0" in _desc_error(key_bias=0x10,
                                                               key_bias_batch_stride=-3)
    assert "lse must be F32 [1, 2, 3, 1]" in _desc_error(**{"lse.shape[3]": 2})
    assert "o is [1, 2, 3, 9]" in _desc_error(**{"o.shape[3]": 9})
    assert "v stride[2] = -1" in _desc_error(**{"v.stride[2]": -1})
    msg = _desc_error(**{"attn_mask.data": 0x10, "attn_mask.type": 0,
                         "attn_mask.shape": (1, 1, 3, 11), "attn_mask.stride": (0, 0, 11, 1)})
    assert "attn_mask is [1, 1, 3, 11]" in msg
    assert "above its cap of 7" in _desc_error(backend=2, reference_max_bytes=7)


def test_bfloat16_helpers_match_c():
    L = _capi.lib()
    xs = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, -3.14159, 65504.0, 1e-40, 3.4e38,
                   np.inf, -np.inf], dtype=np.float32)
    bits = dhsa.to_bfloat16(xs)
    for x, b in zip(xs, bits):
        assert int(b) == L.dhsa_f32_to_bf16(float(x)), x
    back = dhsa.from_bfloat16(bits)
    for b, y in zip(bits, back):
        assert np.float32(L.dhsa_bf16_to_f32(int(b))) == y or (np.isnan(y))
    assert np.isnan(dhsa.from_bfloat16(dhsa.to_bfloat16(np.float32(np.nan))))


def test_router_defaults_are_the_c_defaults():
    """dhsa.RouterParams() gives C what dhsa_router_default_params does, field
    for field (the mirror once lacked score_mode, so Python routed with
    POOLED chunk scores where C's default is MOMENTS)."""
    c = _capi.lib().dhsa_router_default_params()
    py, _ = dhsa.RouterParams().to_c()
    for field, _ in _capi.RouterParams._fields_:
        if field == "predictor":
            continue
        assert getattr(py, field) == getattr(c, field), field
