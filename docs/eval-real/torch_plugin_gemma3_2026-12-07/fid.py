# KL(dense || method), top-1 agreement and perplexity of dhsa.torch's
# transformers plug-in on gemma-3-270m (GGUF dequantized by transformers),
# one window of W tokens (BOS + the first W-1 of GPL-3 as dhsa tokenizes it),
# fed in ubatches of 512 through the KV cache, as `dhsa eval fidelity` does.
import sys, time, json, torch, transformers, dhsa.torch as dt
W = int(sys.argv[1]); methods = sys.argv[2].split(",")
ids = [2] + [int(x) for x in open("gpl3_ids.txt").read().split()][:W - 1]
ids = torch.tensor([ids])
m = transformers.AutoModelForCausalLM.from_pretrained("/work/scratch/g30/hf", gguf_file="gemma-3-270m-q4_k_m.gguf", dtype=torch.float32).eval()
SET = {"dense": dict(method="dense"), "dhsa": dict(method="dhsa", density=0.0625),
       "block": dict(method="block", density=0.0625),
       "dhsa_rest0": dict(method="dhsa", density=0.0625, rest=0),
       "dhsa_ex0": dict(method="dhsa", density=0.0625, exact_rows=0),
       "dhsa_rest0_ex0": dict(method="dhsa", density=0.0625, rest=0, exact_rows=0),
       "block_ex0": dict(method="block", density=0.0625, exact_rows=0)}
caches = {k: transformers.DynamicCache(config=m.config) for k in ["dense"] + methods}
stats = {k: [] for k in methods}
acc = {k: dict(kl=0.0, top1=0, nll=0.0) for k in methods}
nll_d = 0.0; npred = 0; t0 = time.time()
U = 512
with torch.inference_mode():
    for a in range(0, W, U):
        x = ids[:, a:a + U]
        logp = {}
        for k in ["dense"] + methods:
            dt.patch_transformers(m, **SET[k])
            out = m(x, past_key_values=caches[k], use_cache=True)
            if k != "dense":
                stats[k].append(dt.model_stats(m))
            logp[k] = torch.log_softmax(out.logits[0].float(), -1)
            del out
        tgt = ids[0, a + 1:a + U + 1]
        n = tgt.numel()
        ld = logp["dense"]
        nll_d += -ld[torch.arange(n), tgt].sum().item()
        for k in methods:
            lm = logp[k]
            acc[k]["kl"] += (ld.exp() * (ld - lm)).sum(-1).sum().item()
            acc[k]["top1"] += (ld.argmax(-1) == lm.argmax(-1)).sum().item()
            acc[k]["nll"] += -lm[torch.arange(n), tgt].sum().item()
        npred += n
        print("ubatch at %d done, %.0f s" % (a, time.time() - t0), file=sys.stderr, flush=True)
npos = W  # KL and top-1 over every position (the last one too, as eval fidelity)
print("window %d tokens of GPL-3 (BOS + %d), ubatches of %d; dense perplexity %.4f over %d predicted tokens; %.0f s"
      % (W, W - 1, U, __import__("math").exp(nll_d / npred), npred, time.time() - t0))
for k in methods:
    sel = sum(s["selected"] for s in stats[k]); av = sum(s["available"] for s in stats[k])
    sm = sum(s["summaries"] * s["available"] for s in stats[k] if "summaries" in s)
    print("%-12s KL %.4f  top-1 %.3f  ppl %.4f  density used %.3f  summaries %.4f" % (
        k, acc[k]["kl"] / npos, acc[k]["top1"] / npos, __import__("math").exp(acc[k]["nll"] / npred),
        sel / av if av else float("nan"), sm / av if av else float("nan")))
