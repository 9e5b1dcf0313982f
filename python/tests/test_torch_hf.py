"""test_torch_hf.py: dhsa.torch.patch_transformers on small randomly
initialised Hugging Face transformers models (Llama with GQA, Qwen2 with a
sliding window on some layers, Gemma 2 with softcapping and sliding
windows), where PyTorch and transformers are importable (skipped, saying
why, otherwise).

What must hold (issue 15): dhsa dense and DHSA at full density give the
logits of transformers' own eager attention (which materialises the
scores: the independent reference) on a padded batch; greedy generation
runs and, dense, gives eager's tokens; at density 6.25% routing is active
(the measured density is printed and bounded); no L x L mask is built
(the finder sees nothing square in the patched model where it sees the
[B, 1, L, L] mask of transformers' SDPA path).
"""

import dataclasses
import warnings

import pytest

try:
    import torch
except Exception as e:  # not installed, or installed but broken
    pytest.skip("PyTorch is not importable: %s (make test-torch makes a venv with it)" % e,
                allow_module_level=True)
try:
    import transformers
except Exception as e:
    pytest.skip("transformers is not importable: %s (make test-torch makes a venv with it)" % e,
                allow_module_level=True)

import dhsa  # noqa: E402
import dhsa.torch as dt  # noqa: E402

L, B, VOCAB = 200, 2, 256
ROUTER = dict(dense_below=64, sink=16, local=32, q_block=32)  # sparse at short lengths


def make(arch, seed=0):
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**common, use_sliding_window=True, sliding_window=48,
                                       max_window_layers=1,
                                       layer_types=["full_attention", "sliding_attention"])
        cls = transformers.Qwen2ForCausalLM
    elif arch == "gemma3":
        cfg = transformers.Gemma3TextConfig(**common, head_dim=16, sliding_window=48,
                                            query_pre_attn_scalar=16,
                                            layer_types=["sliding_attention", "full_attention"])
        cls = transformers.Gemma3ForCausalLM
    else:
        cfg = transformers.Gemma2Config(**common, head_dim=16, sliding_window=48,
                                        attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
                                        query_pre_attn_scalar=16,
                                        layer_types=["sliding_attention", "full_attention"])
        cls = transformers.Gemma2ForCausalLM
    m = cls(cfg).eval()
    m.set_attn_implementation("eager")
    return m


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (B, L), generator=g)
    am = torch.ones(B, L, dtype=torch.long)
    am[1, :23] = 0  # left padding, as batched generation uses
    return ids, am


ARCHS = ["llama", "qwen2", "gemma2", "gemma3"]


@pytest.mark.parametrize("arch", ARCHS)
def test_dense_and_full_density_equal_eager(arch, close):
    m = make(arch)
    ids, am = batch()
    with torch.inference_mode():
        ref = m(ids, attention_mask=am).logits
        paths = dt.patch_transformers(m, method="dense")
        assert len(paths) == 2 and m.config._attn_implementation == "dhsa"
        dense = m(ids, attention_mask=am).logits
        dt.patch_transformers(m, method="dhsa", density=1.0, **ROUTER)
        full = m(ids, attention_mask=am).logits
        st = dt.model_stats(m)
    real = am.bool()  # padded query rows see no key: not compared
    tol = dict(atol=1e-4, rtol=1e-4)
    close(dense[real].numpy(), ref[real].numpy(), what=arch + " dense", **tol)
    close(full[real].numpy(), ref[real].numpy(), what=arch + " density 1", **tol)
    assert st["calls"] == 2 and st["density"] == 1.0, st
    # the comparison can fail: another model's logits are far off
    with pytest.raises(AssertionError, match="out of tolerance"):
        close(make(arch, seed=5)(ids, attention_mask=am).logits[real].detach().numpy(),
              ref[real].numpy(), **tol)
    dt.unpatch_transformers(m)
    assert m.config._attn_implementation == "eager"


@pytest.mark.parametrize("arch", ARCHS)
def test_generation_and_routing(arch, capsys):
    m = make(arch)
    ids, _ = batch()
    prompt = ids[:1, :120]
    with torch.inference_mode():
        want = m.generate(prompt, max_new_tokens=8, do_sample=False)
        dt.patch_transformers(m, method="dense")
        got = m.generate(prompt, max_new_tokens=8, do_sample=False)
        assert torch.equal(got, want), (got[0, 120:], want[0, 120:])
        dt.patch_transformers(m, method="dhsa", density=0.0625, **ROUTER)
        out = m.generate(ids[:1], max_new_tokens=8, do_sample=False)
    assert out.shape == (1, L + 8)
    st = dt.model_stats(m)
    assert st["calls"] == 2 * 8, st  # 2 layers x (prefill + 7 decode steps)
    # the global layers' calls (a sliding-window layer reads its window
    # densely, as dhsa's sessions do, and counts as density 1)
    routed = [s for s in m._dhsa_stats if s["window"] == 0]
    slid = [s for s in m._dhsa_stats if s["window"] > 0]
    dens = sum(s["selected"] for s in routed) / sum(s["available"] for s in routed)
    with capsys.disabled():
        print("\n%s: DHSA at density 0.0625, L = %d + 8 generated: measured density %.4f over %d "
              "calls, %.4f over the %d routed ones" % (arch, L, st["density"], st["calls"], dens,
                                                       len(routed)))
    assert len(slid) == (8 if arch != "llama" else 0) and all(s["density"] == 1.0 for s in slid)
    assert 0.0 < dens < 0.35, st


@pytest.mark.parametrize("arch", ARCHS)
def test_routing_is_the_sessions(arch, monkeypatch):
    """Every routed call runs what a dhsa session runs for its keys
    (docs/torch.md): RouterParams.for_length(Lk, density), causal
    boundaries, the caller's keywords over them, and on a model that
    interleaves sliding-window layers (here qwen2, gemma2, gemma3: one
    sliding layer of two) chunks of at most hybrid_max_chunk keys unless
    min/max_chunk are given; sliding-window layers are not routed."""
    from dhsa.torch import _hf
    m = make(arch)
    ids, _ = batch()
    seen = []
    real_params = _hf._params

    def spy(cfg, n):
        got = real_params(cfg, n)
        seen.append((n, 0, got))
        return got

    monkeypatch.setattr(_hf, "_params", spy)
    hybrid = arch != "llama"
    with torch.inference_mode():
        dt.patch_transformers(m, method="dhsa", density=0.0625)
        m.generate(ids[:1, :150], max_new_tokens=3, do_sample=False)
    assert len(seen) == (3 if hybrid else 6)  # (prefill + 2 decode steps) x global layers
    for n, window, p in seen:
        assert p == real_params(m.model.layers[-1].self_attn._dhsa, n)
        want = dataclasses.replace(dhsa.RouterParams.for_length(n, 0.0625), causal_boundaries=True)
        if hybrid:
            want = dataclasses.replace(want, max_chunk=min(want.max_chunk, 16),
                                       min_chunk=min(want.min_chunk, 16))
        assert p == want, (n, p, want)
    # the user's keywords over the defaults; min/max_chunk given keep the sizes given
    dt.patch_transformers(m, method="block", density=0.125, q_block=32, max_chunk=48)
    p = dt.router_params(m, 4096)
    base = dhsa.RouterParams.for_length(4096, 0.125)
    assert (p.method, p.density, p.q_block, p.max_chunk, p.min_chunk, p.local) == \
        ("block", 0.125, 32, 48, base.min_chunk, base.local)
    assert p.causal_boundaries
    dt.patch_transformers(m, method="dhsa", hybrid_max_chunk=0)
    assert dt.router_params(m, 16384).max_chunk == dhsa.RouterParams.for_length(16384).max_chunk
    dt.patch_transformers(m, method="dense")
    assert dt.router_params(m, 100) is None


def test_no_square_mask_when_patched():
    m = make("llama")
    m.set_attn_implementation("sdpa")
    ids, am = batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dt.ProductionModeWarning)
        before = dt.find_square_intermediates(m, ids, attention_mask=am)
        assert any(f.shape[-2:] == (L, L) for f in before), str(before)
        dt.patch_transformers(m, method="dense")
        after = dt.find_square_intermediates(m, ids, attention_mask=am)
    assert not after, str(after)


def test_refusals():
    from transformers import masking_utils as mu
    with pytest.raises(TypeError, match="Llama, Qwen2, Gemma2 and Gemma3"):
        dt.patch_transformers(torch.nn.Linear(2, 2))
    m = make("llama")
    with pytest.raises(ValueError, match="method"):
        dt.patch_transformers(m, method="sparse")
    with pytest.raises(TypeError):
        dt.patch_transformers(m, method="dhsa", densty=0.1)
    from dhsa.torch import _hf
    odd = mu.or_masks(mu.causal_mask_function, mu.bidirectional_mask_function)
    with pytest.raises(NotImplementedError, match="neither causal"):
        _hf._mask(1, 4, 4, mask_function=odd)
    assert _hf._window_of(mu.sliding_window_causal_mask_function(7), mu) == 7
    assert _hf._window_of(mu.causal_mask_function, mu) == 0
    dt.patch_transformers(m, method="dense")
    with pytest.raises(ValueError, match="dropout"):
        _hf._attention(m.model.layers[0].self_attn, torch.zeros(1, 4, 3, 16),
                       torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 3, 16), None, dropout=0.1)


def _rest_reference(q, k, v, lay, starts, scale, softcap):
    """float64: per row, softmax over the layout's keys (causal) and the
    chunks its block leaves out (ending at or before the block's first row,
    no key in the block's ranges) as mean key / mean value / + log n."""
    B, Hq, L, d = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(B, L, Hq, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        st = starts[b]
        for g in range(Hkv):
            for blk in range(lay.n_blocks):
                rg = lay.ranges(b, g, blk)
                taken = torch.zeros(L, dtype=torch.bool)
                for s0, e0 in rg:
                    taken[s0:e0] = True
                first = blk * lay.q_block
                chunks = [(st[c], st[c + 1]) for c in range(len(st) - 1)
                          if st[c + 1] <= first and not bool(taken[st[c]:st[c + 1]].any())]
                for i in range(first, min(L, first + lay.q_block)):
                    keys = torch.nonzero(taken[:i + 1]).flatten()
                    for h in range(g * G, (g + 1) * G):
                        sc = (k[b, g, keys] @ q[b, h, i]) * scale
                        vs = [v[b, g, keys]]
                        if chunks:
                            mk = torch.stack([k[b, g, c0:c1].mean(0) for c0, c1 in chunks])
                            mv = torch.stack([v[b, g, c0:c1].mean(0) for c0, c1 in chunks])
                            ss = (mk @ q[b, h, i]) * scale
                            if softcap:
                                ss = softcap * torch.tanh(ss / softcap)
                            ss = ss + torch.log(torch.tensor([float(c1 - c0) for c0, c1 in chunks],
                                                             dtype=torch.float64))
                            vs.append(mv)
                        else:
                            ss = torch.zeros(0, dtype=torch.float64)
                        if softcap:
                            sc = softcap * torch.tanh(sc / softcap)
                        w = torch.softmax(torch.cat([sc, ss]), 0)
                        out[b, i, h] = w @ torch.cat(vs)
    return out


@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_rest_summaries_against_reference(softcap, close):
    """_rest.attend (the summaries of the chunks a block leaves out, merged
    with the sparse attention through the log-sum-exps) against a float64
    reference written from the rule (src/route/rest.c's)."""
    from dhsa.torch import _rest, _ops, _route
    torch.manual_seed(3)
    B, Hq, Hkv, L, d = 2, 4, 2, 260, 16
    q, k, v = torch.randn(B, Hq, L, d), torch.randn(B, Hkv, L, d), torch.randn(B, Hkv, L, d)
    k[:, :, 100:140] += 2.0 * torch.randn(1, Hkv, 1, d)  # some structure for the boundaries
    p = dataclasses.replace(dhsa.RouterParams.for_length(L, 0.0625), causal_boundaries=True)
    scale = 0.3
    lay = dhsa.route(q.numpy(), k.numpy(), causal=True, params=p)
    o, lse = _ops.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                            sparse=lay, layout="BLHD", scale=scale, softcap=softcap,
                            return_lse=True)
    sparse_only = o.clone()
    n = _rest.attend(o, lse, q, k, v, lay, p, scale, softcap, 0)
    starts = [_route._boundaries(k[b], _route._P(p)).tolist() for b in range(B)]
    assert all(len(s) > 10 for s in starts), starts
    ref = _rest_reference(q, k, v, lay, starts, scale, softcap)
    close(o.double().numpy(), ref.numpy(), what="rest merge", atol=2e-5, rtol=2e-5)
    assert n > 0
    with pytest.raises(AssertionError, match="out of tolerance"):  # the summaries change it
        close(sparse_only.double().numpy(), ref.numpy(), atol=2e-5, rtol=2e-5)
    lay.close()


def test_rest_in_the_plugin(monkeypatch):
    """Summaries run where a session runs them: prompts (not decode steps)
    in the global layers of a hybrid model by default (gemma3 here), in
    layers rest - 1 and after with rest = n, nowhere with rest = 0 or on a
    model that does not slide (llama)."""
    def prefill_summaries(arch, **router):
        m = make(arch)
        ids, _ = batch()
        with torch.inference_mode():
            dt.patch_transformers(m, method="dhsa", density=0.0625, **router)
            m.generate(ids[:1, :180], max_new_tokens=2, do_sample=False)
        rows = [(s["Lq"], s["window"], s["summaries"]) for s in m._dhsa_stats]
        return rows, dt.model_stats(m)

    rows, st = prefill_summaries("gemma3")
    assert [r for r in rows if r[1] == 0 and r[0] > 1][0][2] > 0, rows  # the prompt's global layer
    assert all(r[2] == 0 for r in rows if r[0] == 1 or r[1] > 0), rows  # decode steps, sliding layer
    assert 0 < st["summaries"] < 0.2, st
    rows, _ = prefill_summaries("gemma3", rest=0)
    assert all(r[2] == 0 for r in rows), rows
    rows, _ = prefill_summaries("llama")
    assert all(r[2] == 0 for r in rows), rows
    rows, _ = prefill_summaries("llama", rest=2)  # layer 1 of 0, 1
    pre = [r for r in rows if r[0] > 1]
    assert pre[0][2] == 0 and pre[1][2] > 0, rows


def test_rest_on_both_backends(close):
    """The summaries over the torch back end's layout (a TorchLayout, as the
    plug-in's torch back end routes) equal those over the C router's
    layout for the same call; and on a model the torch back end runs them
    (gemma3, a prompt of 180; the C back end routes by the session's decode
    index instead, docs/torch.md)."""
    from dhsa.torch import _rest, _ops
    torch.manual_seed(5)
    B, Hq, Hkv, L, d = 1, 4, 2, 240, 16
    q, k, v = torch.randn(B, Hq, L, d), torch.randn(B, Hkv, L, d), torch.randn(B, Hkv, L, d)
    p = dataclasses.replace(dhsa.RouterParams.for_length(L), causal_boundaries=True)
    out = {}
    for be in ("c", "torch"):
        lay = _ops.route(q, k, causal=True, sparse=p, backend=be)
        o, lse = _ops.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                                sparse=lay, layout="BLHD", return_lse=True, backend=be)
        assert _rest.attend(o, lse, q, k, v, lay, p, d ** -0.5, 0.0, 0) > 0
        out[be] = o
        lay.close()
    close(out["c"].numpy(), out["torch"].numpy(), what="summaries, c vs torch layouts",
          atol=1e-4, rtol=1e-4)
    m = make("gemma3")
    ids, _ = batch()
    with torch.inference_mode():
        dt.patch_transformers(m, method="dhsa", density=0.0625, backend="torch")
        m(ids[:1, :180])
        assert dt.model_stats(m)["summaries"] > 0


def test_rest_with_c_only_routing():
    """The summaries' chunks where the torch router cannot cut them: learned
    boundaries cut causally (from the C decode index) and a chunk score only
    the C router has ("rows": the boundaries do not depend on it)."""
    from dhsa.torch import _rest, _ops
    torch.manual_seed(0)
    B, Hq, Hkv, L, d = 1, 4, 2, 300, 16
    q, k, v = torch.randn(B, Hq, L, d), torch.randn(B, Hkv, L, d), torch.randn(B, Hkv, L, d)
    base = dataclasses.replace(dhsa.RouterParams.for_length(L), causal_boundaries=True)
    for p in (dataclasses.replace(base, boundary=dhsa.Predictor.random(Hkv * d)),
              dataclasses.replace(base, score="rows")):
        lay = dhsa.route(q.numpy(), k.numpy(), causal=True, params=p)
        o, lse = _ops.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                causal=True, sparse=lay, layout="BLHD", return_lse=True)
        before = o.clone()
        assert _rest.attend(o, lse, q, k, v, lay, p, d ** -0.5, 0.0, 0) > 0
        assert not torch.allclose(o, before)
        lay.close()


def test_exact_rows_in_the_plugin(close):
    """The plug-in routes as a session does (C back end): by a decode index
    over the call's keys, and a prompt call's last rows rank their chunks by
    their exact attention: rows from the start of the query block holding
    row Lq - exact_rows by the index's exact ranking
    (dhsa_kv_index_route_exact), the rows before by its estimate; checked
    against that composition written out here, against exact_rows=0, and on
    decode steps (none)."""
    from dhsa.torch import _hf, _ops
    m = make("llama")
    torch.manual_seed(7)
    Lq, d = 200, 16
    q, k, v = torch.randn(1, 4, Lq, d), torch.randn(1, 2, Lq, d), torch.randn(1, 2, Lq, d)
    t = q[:, ::2, -8:, :].mean(2)
    t = t / t.norm(dim=-1, keepdim=True)
    k[:, :, 30:60] -= 0.9 * t[:, :, None, :]  # a needle the last rows attend, among keys that hide it
    k[:, :, 44] = 3.0 * t
    mod = m.model.layers[0].self_attn
    with torch.inference_mode():
        dt.patch_transformers(m, method="dhsa", density=0.0625)
        got, _ = _hf._attention(mod, q, k, v, None, scaling=0.25)
        st = m._dhsa_stats[-1]
        p = dt.router_params(m, Lq)
        r = (Lq - p.exact_rows) - (Lq - p.exact_rows) % p.q_block
        assert st["exact_rows"] == Lq - r > 0, (st, r)
        with dhsa.KVIndex(2, d, Lq, params=p) as ix:  # a session's routing: its decode index
            ix.append(k.numpy())
            lay = ix.route(q[:, :, :r].numpy(), k.numpy(), 0)
            lx = ix.route(q[:, :, r:].numpy(), k.numpy(), r, exact=True, scale=0.25)
            le = ix.route(q[:, :, r:].numpy(), k.numpy(), r)
        head = _ops.attention(q[:, :, :r].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                              causal=True, sparse=lay, scale=0.25, layout="BLHD")
        tail = _ops.attention(q[:, :, r:].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                              causal=True, q_pos0=r, sparse=lx, scale=0.25, layout="BLHD")
        est = _ops.attention(q[:, :, r:].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                             causal=True, q_pos0=r, sparse=le, scale=0.25, layout="BLHD")
        close(got[:, :r].numpy(), head.numpy(), what="rows before", atol=1e-6, rtol=1e-6)
        close(got[:, r:].numpy(), tail.numpy(), what="exact rows", atol=1e-6, rtol=1e-6)
        with pytest.raises(AssertionError, match="out of tolerance"):  # the ranking matters here
            close(est.numpy(), tail.numpy(), atol=1e-6, rtol=1e-6)
        dt.patch_transformers(m, method="dhsa", density=0.0625, exact_rows=0)
        off, _ = _hf._attention(mod, q, k, v, None, scaling=0.25)
        assert m._dhsa_stats[-1]["exact_rows"] == 0
        close(off[:, r:].numpy(), est.numpy(), what="exact_rows=0", atol=1e-6, rtol=1e-6)
        dt.patch_transformers(m, method="dhsa", density=0.0625)
        _hf._attention(mod, q[:, :, -1:], k, v, None, scaling=0.25)  # a decode step
        assert m._dhsa_stats[-1]["exact_rows"] == 0
    for s in (lay, lx, le):
        s.close()


def test_carry_in_the_plugin(close):
    """Decode steps carry chunks as a session's do (RouterParams.carry, C
    back end): a one-row call hands the next the index's chunks that held
    at least `carry` of its attention (dhsa_kv_index_carry), and the next
    step of the same sequence, one key on, routes with them ranked first
    (dhsa_kv_index_route_keep). Checked against that composition written
    out here (a needle chunk the first step reads and the second's
    estimate leaves out: without the carry the second step's output
    differs, so the check can fail); nothing is carried to a first step,
    after a prompt call, to a step whose cache is another sequence's, per
    sequence in a batch, with carry=0; method "block" carries too."""
    from dhsa.torch import _hf, _ops
    m = make("llama")
    torch.manual_seed(11)
    Lk, d = 600, 16
    k, v = torch.randn(1, 2, Lk + 1, d), torch.randn(1, 2, Lk + 1, d)
    t = torch.randn(2, d)
    t = t / t.norm(dim=-1, keepdim=True)
    k[0, :, 300] = 12.0 * t  # the needle: the first step's queries point at it
    q1 = (3.0 * t).repeat_interleave(2, 0)[None, :, None, :]  # [1, 4, 1, d]
    q2 = -q1 + 0.3 * torch.randn(1, 4, 1, d)  # the second step's estimate turns away from it
    mod = m.model.layers[0].self_attn
    sc = 0.25

    def step(q, n, mask=None, kk=None, vv=None):
        kk, vv = k if kk is None else kk, v if vv is None else vv
        o, _ = _hf._attention(mod, q, kk[:, :, :n], vv[:, :, :n], mask, scaling=sc)
        return o, m._dhsa_stats[-1]

    with torch.inference_mode():
        dt.patch_transformers(m, method="dhsa", density=0.0625)
        p1, p2 = dt.router_params(m, Lk), dt.router_params(m, Lk + 1)
        assert p1.carry > 0
        step(torch.randn(1, 4, 8, d), Lk - 1)  # a prompt call: nothing to carry
        _, s1 = step(q1, Lk)  # the first step after it ranks its chunks exactly (as a session's)
        o2, s2 = step(q2, Lk + 1)
        assert s1["carried"] == 0 and s2["carried"] > 0, (s1["carried"], s2["carried"])
        assert s1["exact_rows"] == 1 and s2["exact_rows"] == 0, (s1["exact_rows"], s2["exact_rows"])
        with dhsa.KVIndex(2, d, Lk, params=p1) as ix:
            ix.append(k[:, :, :Lk].numpy())
            lay1 = ix.route(q1.numpy(), k[:, :, :Lk].numpy(), exact=True, scale=sc)
            got = ix.carry(q1.numpy(), k[:, :, :Lk].numpy(), lay1, p1.carry, scale=sc)
            bounds = ix.bounds()
        assert (got[:, 0] >= 0).all() and s2["carried"] == int((got >= 0).sum())
        assert all(bounds[got[g, 0]] <= 300 < bounds[got[g, 0] + 1] for g in range(2)), got
        with dhsa.KVIndex(2, d, Lk + 1, params=p2) as ix:
            ix.append(k.numpy())
            kept = ix.route(q2.numpy(), k.numpy(), keep=got)
            plain = ix.route(q2.numpy(), k.numpy())
        want = _ops.attention(q2.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                              q_pos0=Lk, sparse=kept, scale=sc, layout="BLHD")
        other = _ops.attention(q2.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                               q_pos0=Lk, sparse=plain, scale=sc, layout="BLHD")
        close(o2.numpy(), want.numpy(), what="carried step", atol=1e-6, rtol=1e-6)
        with pytest.raises(AssertionError, match="out of tolerance"):  # the carry matters here
            close(other.numpy(), want.numpy(), atol=1e-6, rtol=1e-6)
        # another sequence's cache one key on: nothing carried
        step(q1, Lk)
        k_other = k.clone()
        k_other[:, :, Lk - 1] += 1.0
        _, s = step(q2, Lk + 1, kk=k_other)
        assert s["carried"] == 0
        # a prompt call between: nothing carried
        step(q1, Lk)
        step(torch.randn(1, 4, 8, d), Lk + 1)
        _, s = step(q2, Lk + 1)
        assert s["carried"] == 0
        # a batch: each sequence its own (the second sequence left-padded)
        kb, vb = torch.cat([k, k.flip(2)]), torch.cat([v, v])
        mask = torch.ones(2, 1, 1, Lk + 1, dtype=torch.bool)
        mask[1, :, :, :5] = False
        _hf._attention(mod, torch.cat([q1, q1]), kb[:, :, :Lk], vb[:, :, :Lk], mask[..., :Lk], scaling=sc)
        ob, sb = step(torch.cat([q2, q2]), Lk + 1, mask=mask, kk=kb, vv=vb)
        assert sb["carried"] >= s2["carried"]
        close(ob[:1].numpy(), want.numpy(), what="batch row 0", atol=1e-6, rtol=1e-6)
        # block carries as a session's does; carry=0 carries nothing
        for kw, want in ((dict(method="block"), True), (dict(method="dhsa", carry=0.0), False)):
            dt.patch_transformers(m, density=0.0625, **kw)
            step(q1, Lk)
            _, s = step(q2, Lk + 1)
            assert (s["carried"] > 0) == want, (kw, s["carried"])
    for s in (lay1, kept, plain):
        s.close()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_torch_backend_routes_as_the_c_one(arch, close):
    """The torch back end (the one a model on a GPU gets) routes as the C
    back end does, that is as a session: the decode index's chunks, the
    prompt's last rows and the first decode step ranked exactly, the
    chunks carried between decode steps, the summaries of the rest on a
    hybrid model; only the attention kernel differs. Checked here on CPU
    tensors with backend="torch" (PyTorch's gather kernel on dhsa's
    layouts): the same logits, step by step, as backend="c" on a padded
    batch, and the same stats for every call."""
    m = make(arch)
    ids, am = batch()
    runs = {}
    with torch.inference_mode():
        for be in ("c", "torch"):
            dt.patch_transformers(m, method="dhsa", density=0.0625, backend=be, **ROUTER)
            out = m.generate(ids, attention_mask=am, max_new_tokens=6, do_sample=False,
                             output_scores=True, return_dict_in_generate=True)
            runs[be] = (out.sequences, torch.stack(out.scores), list(m._dhsa_stats))
    (sc, lc, stc), (st_, lt, stt) = runs["c"], runs["torch"]
    assert torch.equal(sc, st_), (sc[:, L:], st_[:, L:])
    close(lt.numpy(), lc.numpy(), what="logits, torch vs c back end", atol=2e-4, rtol=2e-4)
    assert len(stc) == len(stt)
    keys = ("selected", "available", "exact_rows", "carried", "summaries")
    for a, b in zip(stc, stt):
        assert all(a[x] == b[x] for x in keys), ([a[x] for x in keys], [b[x] for x in keys])
    routed = [s for s in stt if s["window"] == 0]
    assert sum(s["carried"] for s in routed) > 0 and sum(s["exact_rows"] for s in routed) > 0
    if arch == "gemma3":
        assert sum(s["summaries"] for s in routed) > 0
