#!/bin/sh
# bench/eval_retrieval.sh: the default model's retrieval evaluation (issue 10;
# docs/eval.md, the tables in docs/notes/results-evaluation.md "Retrieval on the default model").
#
#   1. held-out filler and keywords: `python3 train/corpus.py` (standard
#      library only) writes train/work/eval.txt (The Devil's Dictionary,
#      dict-devil, never trained on) and keywords_eval.txt (held-out words);
#      the Debian packages are installed when missing.
#   2. passkey and multikey (4 keys): LENGTHS x DEPTHS x TRIALS keys per cell,
#      dense, dhsa (similarity boundaries), block, stream, oracle and, with a
#      predictor file PREDICTOR, dhsa with learned boundaries, at DENSITIES;
#      routing forced on at every length (--dense-below 0 is the eval default;
#      the density used is in every cell). Every sparse miss is printed with
#      the share of the needle's keys each layer selected.
#   3. multivalue (3 values, 1 distractor) at the same grid, fewer trials.
#   4. fidelity on held-out text at 2K tokens: KL, top-1, perplexity,
#      per-layer recall against dense.
#
# Usage: sh bench/eval_retrieval.sh [OUTDIR]   (default build/eval-retrieval)
# Env: LENGTHS (1K,2K,4K,8K,16K), DEPTHS (0,0.25,0.5,0.75,1), TRIALS (10),
#      DENSITIES (0.0625,0.125), TASKS (passkey multikey multivalue), MV_TRIALS (4),
#      METHODS (dense,dhsa,block,stream,oracle), THREADS (all), MODEL (the default),
#      DHSA (build/dhsa), PREDICTOR (none; a predictor file, or "train" to train
#      one for MODEL with `dhsa train-boundary` on 60 KB of training filler first),
#      FIDELITY (1; 0 skips it).
# Writes OUTDIR/TASK.json (every answer: method, density used, expected and
# given text, the needle's keys selected per layer, where the first wrong
# token came from), TASK.svg (a panel per method and density), with a
# predictor also TASK-learned.json and .svg, tables.md (bench/eval_tables.py:
# accuracy per method, length and depth, paired differences with standard
# errors, every miss classified) and fidelity.txt.
# Everything is seeded: a rerun gives the same numbers.
set -e
out=${1:-build/eval-retrieval}
dhsa=${DHSA:-build/dhsa}
lengths=${LENGTHS:-1K,2K,4K,8K,16K}
depths=${DEPTHS:-0,0.25,0.5,0.75,1}
trials=${TRIALS:-10}
mv_trials=${MV_TRIALS:-4}
dens=${DENSITIES:-0.0625,0.125}
tasks=${TASKS:-passkey multikey multivalue}
here=$(cd "$(dirname "$0")/.." && pwd)
[ "$dhsa" = build/dhsa ] && make -s build/dhsa
m="-m ${MODEL:-$here/models/dhsa-retrieval-8m.gguf}"  # train-boundary has no default model
th=
[ -n "$THREADS" ] && th="--threads $THREADS"
if [ ! -f "$here/train/work/eval.txt" ]; then
    need=""
    for p in dict-gcide dict-jargon dict-foldoc dict-devil fortunes fortunes-min; do
        dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
    done
    [ -n "$need" ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need
    python3 "$here/train/corpus.py" "$here/train/work"
fi
fill="--filler $here/train/work/eval.txt --keywords $here/train/work/keywords_eval.txt"
methods=${METHODS:-dense,dhsa,block,stream,oracle}
mkdir -p "$out"
pred=${PREDICTOR:-}
if [ "$pred" = train ]; then
    pred="$out/boundary.prd"
    # 60 KB of *training* filler (never the held-out text the tasks use)
    tail -c +12000001 "$here/train/work/train.txt" | head -c 60000 > "$out/boundary-text.txt"
    $dhsa train-boundary $m --text "$out/boundary-text.txt" -o "$pred" --ctx 512 --max-tokens 8192 \
        --steps 400 --lr 1e-3 > "$out/boundary.txt" 2>&1
fi
files=""
for t in $tasks; do
    tr=$trials
    [ "$t" = multivalue ] && tr=$mv_trials
    $dhsa eval $t $m $th $fill --lengths $lengths --depths $depths --trials $tr --attn $methods \
        --density $dens --svg "$out/$t.svg" --json > "$out/$t.json"
    files="$files $out/$t.json"
    if [ -n "$pred" ]; then
        $dhsa eval $t $m $th $fill --lengths $lengths --depths $depths --trials $tr --attn dhsa \
            --density $dens --boundary "learned:$pred" --svg "$out/$t-learned.svg" --json > "$out/$t-learned.json"
        files="$files $out/$t-learned.json"
    fi
    python3 "$here/bench/eval_tables.py" $files > "$out/tables.md"
done
if [ "${FIDELITY:-1}" != 0 ]; then
    head -c 2000000 "$here/train/work/eval.txt" > "$out/heldout.txt"
    $dhsa eval fidelity $m $th -f "$out/heldout.txt" --ctx 2048 --windows 8 --attn dhsa,block,stream,oracle \
        --density $dens > "$out/fidelity.txt"
fi
echo "wrote $out"
