#!/bin/sh
# gpu.sh: dhsa.torch on a GPU, one command (issue 35; docs/torch.md "Back ends").
# Usage: sh bench/gpu.sh [RESULTS]        (default bench/gpu_results.txt)
# Needs: a CUDA GPU, a Python with torch (+ transformers for part 4) and numpy;
#   PYTHON=... picks it (default: the test venv ~/.cache/dhsa-torch-venv, else
#   python3); build/libdhsa.so (make): the C router is the check's reference.
# Parts (each bounded, the whole under 10 minutes on one H100):
#   1. peak GPU memory of nn.MultiheadAttention with a padding mask (its
#      inference fast path) vs dhsa.torch.MultiheadAttention (SDPA with a
#      [B, 1, 1, P] keep-mask) at P = 2K, 4K, 8K, 16K, 32K (E 256, 8 heads,
#      bf16); an OOM is recorded as such.
#   2. the finder on CUDA: nn.MultiheadAttention's [B, H, P, P] found, the
#      drop-in's nothing (P = 4096).
#   3. prefill time, 8 q / 2 kv heads, d 128, bf16, causal: dense SDPA vs DHSA
#      at density 6.25% (RouterParams.for_length(L)) at 16K..128K: routing by
#      the torch router on the GPU, sparse attention through FlexAttention
#      (compiled; the first call's compile time shown apart), after a check
#      at 16K (layouts vs the C router's, FlexAttention vs the gather kernel);
#      at 128K also BlockMask tiles 128x128, 64x64 (the default), 64x32.
#   GPU_SMOKE=1 sh bench/gpu.sh: part 3 only, on the CPU at 2K and 3K (float32,
#      the gather kernel; the check and the tile rows run FlexAttention
#      eagerly): the script's own test where there is no GPU (about a minute).
#   4. patch_transformers on a small Llama and Qwen2 built from a config with
#      random weights (bf16, 2 x 4K tokens): logits of dense/dhsa vs SDPA,
#      time per forward.
# Writes RESULTS (a temp name, then renamed) and prints it.
set -u
out=${1:-bench/gpu_results.txt}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-}
if [ -z "$py" ]; then
    if [ -x "$HOME/.cache/dhsa-torch-venv/bin/python" ]; then py="$HOME/.cache/dhsa-torch-venv/bin/python"
    else py=python3; fi
fi
[ -f "$here/build/libdhsa.so" ] || { echo "gpu.sh: $here/build/libdhsa.so missing: run make" >&2; exit 2; }
export DHSA_LIB="$here/build/libdhsa.so" PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
tmp="$out.tmp.$$"
timeout 570 "$py" - "$tmp" <<'EOF'
import sys, time, math, traceback, warnings
import torch
out = open(sys.argv[1], "w")
def say(*a):
    s = " ".join(str(x) for x in a)
    print(s); out.write(s + "\n"); out.flush()
import os
SMOKE = os.environ.get("GPU_SMOKE") == "1"
if not torch.cuda.is_available() and not SMOKE:
    say("no CUDA device: nothing run"); sys.exit(3)
import dhsa, dhsa.torch as dt
from dhsa.torch import _backend as dt_backend, _ops as dt_ops
dev = torch.device("cpu" if SMOKE else "cuda")
say("device:", "cpu (GPU_SMOKE=1: part 3 at CPU sizes)" if SMOKE else torch.cuda.get_device_name(0),
    "| torch", torch.__version__)

def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()

def peak(fn):
    torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    try:
        fn(); torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache(); return None
    return torch.cuda.max_memory_allocated() - base

def timed(fn, reps=3):
    fn(); sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t) / reps

# ---- 3. prefill: dense SDPA vs DHSA (torch router + FlexAttention)
def prefill(sizes, dtype, reps):
    say("\n## 3. prefill, 8 q / 2 kv heads, d 128, %s, causal, on %s: dense SDPA vs DHSA density "
        "6.25%% (RouterParams.for_length(L)); the torch router on the device, sparse kernel %s"
        % (str(dtype).replace("torch.", ""), dev, dt_backend.sparse_kernel(dev)))
    # correctness first, at the smallest size: the torch router's layout vs
    # the C router's (q/k copied to the CPU), and the sparse kernel vs the
    # gather kernel on the same layout
    L = sizes[0]
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, 8, L, 128, device=dev, dtype=dtype, generator=g)
    k = torch.randn(1, 2, L, 128, device=dev, dtype=dtype, generator=g)
    v = torch.randn(1, 2, L, 128, device=dev, dtype=dtype, generator=g)
    rp = dhsa.RouterParams.for_length(L, 0.0625)
    with torch.inference_mode():
        lay = dt.route(q, k, causal=True, params=rp)
        with dhsa.route(q.float().cpu().numpy(), k.float().cpu().numpy(), causal=True,
                        params=rp) as cl:
            n = same = 0
            for gg in range(2):
                for qb in range(cl.n_blocks):
                    a, b = cl.ranges(0, gg, qb), lay.ranges(0, gg, qb)
                    n += 1
                    same += int(a.shape == b.shape and (a == b).all())
        old = dt_backend.SPARSE_KERNEL
        dt_backend.SPARSE_KERNEL = "flex"  # eager off CUDA (it builds the scores: small L only)
        o1 = dt_ops.attention(q, k, v, backend="torch", causal=True, sparse=lay)
        dt_backend.SPARSE_KERNEL = "gather"
        o2 = dt_ops.attention(q, k, v, backend="torch", causal=True, sparse=lay)
        dt_backend.SPARSE_KERNEL = old
    say("check at L %d: layouts equal to the C router's in %d of %d blocks; FlexAttention vs "
        "the gather kernel max |diff| %.2e" % (L, same, n, (o1.float() - o2.float()).abs().max().item()))
    del q, k, v, o1, o2, lay
    say("L | dense SDPA ms | DHSA route ms | DHSA attention ms (first call, compile) | "
        "speedup (attention) | speedup (route + attention) | density")
    for L in sizes:
        try:
            g = torch.Generator(device=dev).manual_seed(0)
            q = torch.randn(1, 8, L, 128, device=dev, dtype=dtype, generator=g)
            k = torch.randn(1, 2, L, 128, device=dev, dtype=dtype, generator=g)
            v = torch.randn(1, 2, L, 128, device=dev, dtype=dtype, generator=g)
            rp = dhsa.RouterParams.for_length(L, 0.0625)
            with torch.inference_mode():
                td = timed(lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=True, enable_gqa=True), reps=reps)
                box = {}
                tr = timed(lambda: box.__setitem__("lay", dt.route(q, k, causal=True, params=rp)),
                           reps=reps)
                lay = box["lay"]
                t0 = time.perf_counter()
                dt_ops.attention(q, k, v, backend="torch", causal=True, sparse=lay)
                sync()
                tfirst = time.perf_counter() - t0
                ts = timed(lambda: dt_ops.attention(q, k, v, backend="torch", causal=True,
                                                     sparse=lay), reps=reps)
                dens = lay.stats()["density"]
            say(L, "|", "%.1f" % (td * 1e3), "|", "%.1f" % (tr * 1e3), "|",
                "%.1f (%.1f s)" % (ts * 1e3, tfirst), "|", "%.2fx" % (td / ts), "|",
                "%.2fx" % (td / (tr + ts)), "| %.4f" % dens)
            if L == sizes[-1] and (dt_backend.sparse_kernel(dev) == "flex" or SMOKE):
                # the BlockMask tile at the largest size: smaller tiles list
                # fewer keys of the scattered chunks, larger ones run faster
                # (smoke: FlexAttention eagerly, to run this code)
                old, oldk = dt_backend.FLEX_TILE, dt_backend.SPARSE_KERNEL
                dt_backend.SPARSE_KERNEL = "flex"
                for tile in ((128, 128), (64, 64), (64, 32)):
                    dt_backend.FLEX_TILE = tile
                    try:
                        with torch.inference_mode():
                            bm = dt_backend.flex_block_mask(lay, 8, lambda b, h, qi, ki: qi >= ki)
                            share = (bm.kv_num_blocks.double().sum(-1).mean().item() * tile[0]
                                     * tile[1] / (L * L / 2))
                            tt = timed(lambda: dt_ops.attention(q, k, v, backend="torch",
                                                                causal=True, sparse=lay),
                                       reps=reps)
                        say("  tile %dx%d: attention %.1f ms, %.2fx dense; listed tiles %.3f of "
                            "the causal area" % (tile[0], tile[1], tt * 1e3, td / tt, share))
                    except Exception:
                        say("  tile %dx%d failed:" % tile,
                            traceback.format_exc().replace("\n", " | ")[-400:])
                dt_backend.FLEX_TILE, dt_backend.SPARSE_KERNEL = old, oldk
            del q, k, v, lay, box
        except Exception:
            say(L, "failed:", traceback.format_exc().replace("\n", " | ")[-600:])
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if SMOKE:  # part 3 only, on the CPU, at CPU sizes
    prefill((2048, 3072), torch.float32, 1)
    say("\ndone (smoke)")
    sys.exit(0)

# ---- 1. MHA with a padding mask vs the drop-in: peak GPU memory
say("\n## 1. peak GPU memory, MHA + key_padding_mask vs dhsa.torch drop-in (E 256, 8 heads, bf16, B 1)")
say("P | nn.MultiheadAttention | dhsa.torch.MultiheadAttention | ratio")
E, H = 256, 8
mha = torch.nn.MultiheadAttention(E, H, batch_first=True).to(dev, torch.bfloat16).eval()
drop = dt.MultiheadAttention.from_module(mha)
for P in (2048, 4096, 8192, 16384, 32768):
    x = torch.randn(1, P, E, device=dev, dtype=torch.bfloat16)
    pad = torch.zeros(1, P, dtype=torch.bool, device=dev); pad[:, -P // 8:] = True
    with torch.inference_mode():
        a = peak(lambda: mha(x, x, x, key_padding_mask=pad, need_weights=False))
        b = peak(lambda: drop(x, x, x, key_padding_mask=pad, need_weights=False))
    fmt = lambda n: "OOM" if n is None else "%.1f MiB" % (n / 2**20)
    say(P, "|", fmt(a), "|", fmt(b), "|", "-" if a is None or not b else "%.1fx" % (a / b))
    del x, pad

# ---- 2. the finder on CUDA
say("\n## 2. find_square_intermediates on CUDA (P 4096)")
try:
    P = 4096
    x = torch.randn(1, P, E, device=dev, dtype=torch.bfloat16)
    pad = torch.zeros(1, P, dtype=torch.bool, device=dev); pad[:, -512:] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f1 = dt.find_square_intermediates(mha, x, x, x, key_padding_mask=pad, need_weights=False)
        f2 = dt.find_square_intermediates(drop, x, x, x, key_padding_mask=pad, need_weights=False)
    say("nn.MultiheadAttention:", len(f1), "finding(s):", str(f1).replace("\n", " / ")[:300])
    say("drop-in:", len(f2), "finding(s):", str(f2).replace("\n", " / ")[:300])
except Exception:
    say("finder failed:", traceback.format_exc().replace("\n", " | "))

# ---- 3. prefill (the function above)
prefill((16384, 32768, 65536, 131072), torch.bfloat16, 2)

# ---- 4. patch_transformers on small random models
say("\n## 4. patch_transformers, random weights, bf16, B 2 x 4096 tokens (left padding 100)")
try:
    import transformers
    for arch in ("llama", "qwen2"):
        torch.manual_seed(0)
        common = dict(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192)
        cfg = (transformers.LlamaConfig if arch == "llama" else transformers.Qwen2Config)(**common)
        cls = transformers.LlamaForCausalLM if arch == "llama" else transformers.Qwen2ForCausalLM
        m = cls(cfg).to(dev, torch.bfloat16).eval(); m.set_attn_implementation("sdpa")
        ids = torch.randint(0, 1024, (2, 4096), device=dev)
        am = torch.ones(2, 4096, dtype=torch.long, device=dev); am[1, :100] = 0
        real = am.bool()
        with torch.inference_mode():
            ref = m(ids, attention_mask=am).logits[real].float()
            tref = timed(lambda: m(ids, attention_mask=am), reps=2)
            for method in ("dense", "dhsa"):
                dt.patch_transformers(m, method=method, density=0.0625)
                lg = m(ids, attention_mask=am).logits[real].float()
                t = timed(lambda: m(ids, attention_mask=am), reps=2)
                err = (lg - ref).abs().max().item()
                extra = (" density %.4f" % dt.model_stats(m)["density"]) if method == "dhsa" else ""
                say(arch, method, "| max |logit - sdpa| %.4f" % err, "| %.1f ms/forward (sdpa %.1f)"
                    % (t * 1e3, tref * 1e3) + extra)
            dt.unpatch_transformers(m)
        del m
        torch.cuda.empty_cache()
except Exception:
    say("patch_transformers failed:", traceback.format_exc().replace("\n", " | ")[-800:])
say("\ndone")
EOF
rc=$?
if [ $rc -eq 3 ]; then rm -f "$tmp"; exit 3; fi   # no CUDA device: no results file
if [ -s "$tmp" ]; then mv "$tmp" "$out"; echo "gpu.sh: wrote $out (exit $rc)"; else rm -f "$tmp"; fi
exit $rc
