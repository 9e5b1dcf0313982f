#!/bin/sh
# real_peer.sh: dhsa against llama.cpp on real pretrained GGUF files
# (issue 32 item 3; the table "Real models against llama.cpp" of
# docs/notes/results-models.md). For each model file:
#   1. token ids of a corpus of mixed prose (the GPL-3 text), C code
#      (src/attn/attn.c), numbers and ten scripts (bench/multilingual.txt):
#      dhsa tokenize vs llama-tokenize, equal or the first difference;
#   2. next-token logits over the first 2048 tokens of held-out text (the
#      Apache-2.0 licence text): llama.cpp's (bench/llamacpp_logits.c)
#      against dhsa's exact and fast routes (bench/real_compare.c): relative
#      L2, top-1 agreement, KL;
#   3. the first 32 of those tokens against the float64 forward of
#      tests/llm_ref.h (bench/arch_compare.c): how far dhsa's exact route and
#      llama.cpp each are from exact arithmetic on the same weights;
#   4. 64 greedy tokens after a fixed prompt: llama.cpp's
#      (bench/llamacpp_greedy.c) against `dhsa run --temp 0 --ids` with
#      --exact and the fast route; where they part, llama.cpp's logit gap
#      between its token and dhsa's at that step.
# llama.cpp: CPU, no repacked weights, F32 KV cache, flash attention off,
# full SWA cache, 2 threads. Not run by make test.
#
# usage: LLAMA_CPP=/path/to/llama.cpp sh bench/real_peer.sh OUT_DIR MODEL.gguf...
set -e
L=${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp checkout with build/ (shared libraries in build/bin)}
out=${1:?usage: real_peer.sh OUT_DIR MODEL.gguf...}; shift
mkdir -p "$out"
dhsa=build/dhsa
[ -x "$dhsa" ] || { echo "build dhsa first (make)"; exit 2; }
for p in llamacpp_logits llamacpp_greedy; do
    cc -O2 -I"$L/include" -I"$L/ggml/include" bench/$p.c -o "$out/$p" -L"$L/build/bin" -lllama -lggml -lggml-base \
        -Wl,-rpath,"$L/build/bin"
done
cc -std=c11 -O2 -D_GNU_SOURCE -Iinclude bench/real_compare.c -o "$out/real_compare" build/libdhsa.a -lm -lpthread
cc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Itests bench/arch_compare.c -o "$out/arch_compare" build/libdhsa.a -lm -lpthread
corpus="$out/corpus.txt"
{ cat /usr/share/common-licenses/GPL-3; cat src/attn/attn.c; seq 1 7 3000 | tr '\n' ' '; echo; cat bench/multilingual.txt; } > "$corpus"
prompt="The three primary colors are red, yellow and"
for model in "$@"; do
    name=$(basename "$model" .gguf)
    echo "== $name ($(wc -w < "$corpus") corpus words)"
    # 1. token ids
    $dhsa tokenize -m "$model" --ids-only -f "$corpus" | tr ' ' '\n' | grep -v '^$' > "$out/$name.ids.dhsa"
    "$L/build/bin/llama-tokenize" -m "$model" -f "$corpus" --ids --log-disable --no-parse-special 2>/dev/null |
        tr -d '[],' | tr ' ' '\n' | grep -v '^$' > "$out/$name.ids.llama"
    if cmp -s "$out/$name.ids.dhsa" "$out/$name.ids.llama"; then
        echo "tokens: $(wc -l < "$out/$name.ids.dhsa") ids, equal"
    else
        echo "tokens: DIFFER: dhsa $(wc -l < "$out/$name.ids.dhsa"), llama.cpp $(wc -l < "$out/$name.ids.llama"); first difference at line $(cmp "$out/$name.ids.dhsa" "$out/$name.ids.llama" | sed 's/.*line //')"
    fi
    # 2. logits over 2048 held-out tokens
    ids=$($dhsa tokenize -m "$model" --ids-only -f /usr/share/common-licenses/Apache-2.0 | tr ' ' '\n' | grep -v '^$' | head -n 2048 | tr '\n' ' ')
    "$out/llamacpp_logits" "$model" 2048 "$out/$name.logits.f32" $ids
    "$out/real_compare" "$model" "$out/$name.logits.f32" $ids
    rm -f "$out/$name.logits.f32"
    # 3. 32 tokens against the float64 forward
    ids32=$(echo $ids | tr ' ' '\n' | head -n 32 | tr '\n' ' ')
    "$out/llamacpp_logits" "$model" 64 "$out/$name.logits32.f32" $ids32
    printf 'float64 forward, 32 tokens (relative L2 to it; argmax agreeing): '
    "$out/arch_compare" "$model" 64 "$out/$name.logits32.f32" $ids32
    rm -f "$out/$name.logits32.f32"
    # 4. 64 greedy tokens
    pids=$($dhsa tokenize -m "$model" --ids-only "$prompt")
    "$out/llamacpp_greedy" "$model" 64 $pids > "$out/$name.greedy.llama"
    cut -d' ' -f2 "$out/$name.greedy.llama" > "$out/$name.gen.llama"
    n_ref=$(wc -l < "$out/$name.gen.llama")
    for flag in --exact ""; do
        $dhsa run -m "$model" -p "$prompt" -n "$n_ref" --temp 0 --ids --ignore-eos --ctx 256 --kv f32 $flag 2>/dev/null |
            tr ' ' '\n' | grep -v '^$' | tail -n "$n_ref" > "$out/$name.gen.dhsa"
        diffat=$(paste -d' ' "$out/$name.gen.llama" "$out/$name.gen.dhsa" | awk '$1 != $2 { print NR - 1; exit }')
        label=$([ -n "$flag" ] && echo exact || echo fast)
        if [ -z "$diffat" ]; then
            echo "greedy, $label: $n_ref tokens equal to llama.cpp's"
        else
            d=$(sed -n "$((diffat + 1))p" "$out/$name.gen.dhsa")
            line=$(sed -n "$((diffat + 1))p" "$out/$name.greedy.llama")
            gap=$(echo "$line" | awk -v d="$d" '{ split($3, a, ":"); g = "not in its top 5"; for (i = 3; i <= NF; i++) { split($i, b, ":"); if (b[1] == d) g = sprintf("%.6f", a[2] - b[2]) } print g }')
            echo "greedy, $label: parts at token $diffat of $n_ref (llama.cpp $(echo "$line" | cut -d' ' -f2), dhsa $d); llama.cpp's logit gap between them: $gap"
        fi
    done
done
