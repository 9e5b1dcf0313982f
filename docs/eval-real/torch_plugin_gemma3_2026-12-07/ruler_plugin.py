# dhsa.torch's transformers plug-in on gemma-3-270m (GGUF dequantized by
# transformers) answering the held-out RULER prompts of `dhsa eval ruler`
# (dhsa.ruler_prompt: the same ids), greedy, RULER's answer budget, cut at
# the prompt's stop strings, scored by dhsa.ruler_score.
import sys, time, torch, transformers, dhsa, dhsa.torch as dt
tasks = sys.argv[1].split(","); length = int(sys.argv[2]); seed = int(sys.argv[3]); methods = sys.argv[4].split(",")
out = open(sys.argv[5], "a")
G = "/root/.cache/dhsa/models/gemma-3-270m-q4_k_m.gguf"
dm = dhsa.Model(G)
m = transformers.AutoModelForCausalLM.from_pretrained("/work/scratch/g30/hf", gguf_file="gemma-3-270m-q4_k_m.gguf", dtype=torch.float32).eval()
ALL = ["single_noise", "single_prose", "single_uuid", "single_word", "multikey", "multikey_needles",
       "multikey_uuid", "multivalue", "multiquery", "vt", "cwe", "fwe"]
M64 = (1 << 64) - 1
def cli_seed(task, length, depth, trial):
    """tools/eval_tasks.c's seed of a cell (the same prompts as `dhsa eval ruler --seed`)."""
    s = ((seed * 0x9E3779B97F4A7C15) & M64) ^ (ALL.index(task) << 48) ^ (length << 20) ^ \
        (int(round(depth * 1000 + 1000)) << 8) ^ trial
    s = (s + 0x9e3779b97f4a7c15) & M64
    z = s
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)
done = set(tuple(l.split("\t")[:4]) for l in open(sys.argv[5]) if not l.startswith("#")) if True else set()
for task in tasks:
    for depth in (0, 0.25, 0.5, 0.75, 1):
        for trial in range(2):
            pr = dhsa.ruler_prompt(dm, task, length=length, depth=depth, seed=cli_seed(task, length, depth, trial),
                                   split="test")
            ids = torch.tensor([pr["ids"]])
            for meth in methods:
                key = (task, str(depth), str(trial), meth)
                if key in done:
                    continue
                t0 = time.time()
                if meth == "dense":
                    dt.patch_transformers(m, method="dense")
                else:
                    dt.patch_transformers(m, method=meth, density=0.0625)
                with torch.inference_mode():
                    g = m.generate(ids, max_new_tokens=pr["answer_tokens"], do_sample=False)
                new = g[0, ids.shape[1]:].tolist()
                for i, t in enumerate(new):  # the answer ends at a stop id, as the CLI's does
                    if t in pr["stop"]:
                        new = new[:i]
                        break
                cut = dm.detokenize(new)
                sc = dhsa.ruler_score(pr["expected"], cut)
                st = dt.model_stats(m) if meth != "dense" else {"density": 1.0, "summaries": 0.0}
                out.write("\t".join([task, str(depth), str(trial), meth, "%.4f" % sc, "%.4f" % st["density"],
                                     "%.4f" % st["summaries"], "|".join(pr["expected"]), repr(cut[:80]),
                                     "%.1f" % (time.time() - t0)]) + "\n")
                out.flush()
                print(task, depth, trial, meth, sc, repr(cut[:40]), flush=True)
