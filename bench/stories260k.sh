#!/bin/sh
# bench/stories260k.sh: dhsa run vs llama2.c's run.c on stories260K, same
# machine, same run, interleaved: greedy "Once upon a time", 256 positions.
# Usage: RUN_C=/path/to/llama2.c/run sh bench/stories260k.sh [REPS]
# RUN_C is a run.c binary built outside this repository (gcc -O3 -o run
# run.c -lm); without it only dhsa is measured. Prints each rep and the
# medians; docs/notes/results-models.md records a run.
set -e
reps=${1:-7}
m=../shared/models
[ -f $m/stories260K.bin ] || { echo "SKIP: $m/stories260K.bin absent"; exit 0; }
d=build/dhsa
[ -x $d ] || make -s build/dhsa
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
: > /tmp/dhsa_s260_1; : > /tmp/dhsa_s260_2; : > /tmp/dhsa_s260_c
for i in $(seq 1 $reps); do
    for t in 1 2; do
        $d run -m $m/stories260K.bin --tokenizer $m/tok512.bin -p "Once upon a time" -n 252 --temp 0 \
            --threads $t 2>&1 >/dev/null | sed -n 's/.*all forward passes: \([0-9.]*\) tok.*/\1/p' >> /tmp/dhsa_s260_$t
    done
    if [ -n "$RUN_C" ]; then
        $RUN_C $m/stories260K.bin -z $m/tok512.bin -t 0 -n 256 -i "Once upon a time" 2>&1 >/dev/null |
            sed -n 's/achieved tok\/s: \([0-9.]*\)/\1/p' >> /tmp/dhsa_s260_c
    fi
done
echo "dhsa 1 thread  tok/s per rep: $(tr '\n' ' ' < /tmp/dhsa_s260_1) median $(median < /tmp/dhsa_s260_1)"
echo "dhsa 2 threads tok/s per rep: $(tr '\n' ' ' < /tmp/dhsa_s260_2) median $(median < /tmp/dhsa_s260_2)"
[ -n "$RUN_C" ] && echo "run.c          tok/s per rep: $(tr '\n' ' ' < /tmp/dhsa_s260_c) median $(median < /tmp/dhsa_s260_c)"
exit 0
