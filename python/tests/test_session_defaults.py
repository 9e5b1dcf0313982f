"""test_session_defaults.py: dhsa.Session's KV cache is F16 by default, as
the library's (dhsa_session_default_params) and the CLI's (docs/model.md,
"Defaults"): the plan's cache is half the F32 one, and kv="f32" still gives
the exact cache. Uses the shipped default model."""

import dhsa


def test_default_kv_is_f16():
    m = dhsa.Model()
    try:
        d = dhsa.Session(m, ctx=1024)
        f16 = dhsa.Session(m, ctx=1024, kv="f16")
        f32 = dhsa.Session(m, ctx=1024, kv="f32")
        try:
            kv = {name: s.plan["kv_cache"]
                  for name, s in (("default", d), ("f16", f16), ("f32", f32))}
        finally:
            for s in (d, f16, f32):
                s.close()
    finally:
        m.close()
    assert kv["default"] == kv["f16"] and kv["f32"] == 2 * kv["f16"], kv
