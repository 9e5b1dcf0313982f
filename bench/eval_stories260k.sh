#!/bin/sh
# bench/eval_stories260k.sh: the evaluation of issue 5 on stories260K
# (docs/eval.md; the tables in docs/notes/results-evaluation.md, "Evaluation on stories260K").
#
#   1. text: there is no dataset here, so the fidelity text is the model's
#      own: TEXTS samples of 520 tokens (temperature 1, the sampler's other
#      defaults, seeds 1001..1000+TEXTS, default 16: about 8.3K tokens),
#      concatenated. The seeds are disjoint from the predictor's training
#      text (bench/train_stories260k.sh uses seeds 1..200).
#   2. fidelity at the 512-token context: dhsa, block, stream, oracle at
#      densities 0.125, 0.25 and 0.5 against dense (KL, top-1, perplexity,
#      per-layer recall, density used).
#   3. copy: lengths 512, 1K, 2K, 4K x depths 0.05 .. 0.95, TRIALS (4)
#      random passages, all methods at 12.5%; heat maps in docs/.
#   4. niah: the same grid, plain prompt (stories260K has no chat template);
#      heat map in docs/.
#   5. learned vs similarity vs fixed boundaries (fidelity and copy), when
#      the predictor file PREDICTOR (default build/stories260K.prd, made by
#      bench/train_stories260k.sh) exists; skipped otherwise.
#
# Usage: sh bench/eval_stories260k.sh [OUTDIR]   (default build/eval)
# Env: TEXTS (16), TRIALS (4), THREADS (all), PREDICTOR, DHSA (build/dhsa).
# Writes OUTDIR/*.txt (tables) and *.json; the SVGs go to docs/ (small,
# committed). Everything is seeded: a rerun gives the same numbers.
set -e
out=${1:-build/eval}
texts=${TEXTS:-16}
trials=${TRIALS:-4}
pred=${PREDICTOR:-build/stories260K.prd}
dhsa=${DHSA:-build/dhsa}
m=../shared/models/stories260K.gguf
[ -f $m ] || { echo "SKIP: $m absent"; exit 0; }
[ "$dhsa" = build/dhsa ] && make -s build/dhsa
th=
[ -n "$THREADS" ] && th="--threads $THREADS"
mkdir -p "$out"
text=$out/stories260K_text.txt
: > "$text"
for s in $(seq 1001 $((1000 + texts))); do
    $dhsa run -m $m --temp 1 --seed "$s" -n 520 --ctx 521 2>/dev/null >> "$text"
    echo >> "$text"
done
echo "text: $text ($(wc -c < "$text") bytes)"

set -x
$dhsa eval fidelity -m $m -f "$text" --ctx 512 --windows 16 --attn dhsa,block,stream,oracle \
    --density 0.125,0.25,0.5 $th | tee "$out/fidelity.txt"
$dhsa eval copy -m $m --lengths 512,1K,2K,4K --depths 0.05,0.25,0.5,0.75,0.95 --trials "$trials" \
    --density 0.125 --svg docs/eval_copy_loss.svg --svg-attn docs/eval_copy_attn.svg $th | tee "$out/copy.txt"
$dhsa eval niah -m $m --lengths 512,1K,2K,4K --depths 0,0.25,0.5,0.75,1 --trials 2 --density 0.125 \
    --svg docs/eval_niah.svg $th | tee "$out/niah.txt"
$dhsa eval niah -m $m --lengths 512,1K --depths 0,0.5,1 --trials 1 --attn dense --show $th | tee "$out/niah_answers.txt"
set +x

if [ -f "$pred" ]; then
    sha256sum "$pred" | tee "$out/predictor.sha256"
    set -x
    for b in fixed similarity "learned:$pred"; do
        $dhsa eval fidelity -m $m -f "$text" --ctx 512 --windows 16 --attn dhsa --density 0.125,0.25,0.5 \
            --boundary "$b" $th
    done | tee "$out/boundary_fidelity.txt"
    for b in fixed similarity "learned:$pred"; do
        $dhsa eval copy -m $m --lengths 512,1K,2K --depths 0.05,0.25,0.5,0.75,0.95 --trials "$trials" \
            --attn dhsa --density 0.125 --boundary "$b" $th
    done | tee "$out/boundary_copy.txt"
    set +x
else
    echo "SKIP: no predictor at $pred (sh bench/train_stories260k.sh makes it): learned vs similarity vs fixed not run"
fi
