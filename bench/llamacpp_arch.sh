#!/bin/sh
# llamacpp_arch.sh: dhsa and llama.cpp against the double-precision
# reference (tests/llm_ref.h) on gen-model files of every architecture:
# the table "Checked against llama.cpp" of docs/model.md.
#
# Needs a llama.cpp build outside the repository (its static libraries in
# $LLAMA_CPP/build, its llama-quantize for the requantized rows) and dhsa
# built (make). Not run by make test: the project's tests never depend on
# llama.cpp.
#
# usage: LLAMA_CPP=/path/to/llama.cpp sh bench/llamacpp_arch.sh [OUT_DIR]
set -e
L=${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp checkout with build/}
out=${1:-/tmp/dhsa_llamacpp_arch}
mkdir -p "$out"
dhsa=build/dhsa
[ -x "$dhsa" ] || { echo "build dhsa first (make)"; exit 2; }
cc -O2 -I"$L/include" -I"$L/ggml/include" bench/llamacpp_logits.c -o "$out/llamacpp_logits" \
    "$L/build/src/libllama.a" "$L/build/ggml/src/libggml.a" "$L/build/ggml/src/libggml-cpu.a" \
    "$L/build/ggml/src/libggml-base.a" -lstdc++ -lm -lpthread -fopenmp
cc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Itests bench/arch_compare.c -o "$out/arch_compare" build/libdhsa.a -lm -lpthread
# 48 token ids of the 1024-token vocabulary (BOS first)
ids="1"
i=1; x=7
while [ $i -lt 48 ]; do x=$(( (x * 1103515245 + 12345) % 2147483648 )); ids="$ids $(( 3 + x % 1021 ))"; i=$((i + 1)); done
shape="--n-embd 256 --n-layer 6 --n-head 4 --n-head-kv 2 --n-ff 512 --vocab 1024 --ctx 2048"
# row: label arch n_ctx gen-model-options [llama-quantize type]
row() {
    label=$1 arch=$2 nctx=$3 opts=$4 qtype=$5
    f="$out/$arch.gguf"
    $dhsa gen-model -o "$f" $shape --arch "$arch" $opts >/dev/null
    if [ -n "$qtype" ]; then
        "$L/build/bin/llama-quantize" "$f" "$out/q.gguf" "$qtype" >/dev/null 2>&1 || { echo "| $label | llama-quantize failed |"; return; }
        f="$out/q.gguf"
    fi
    "$out/llamacpp_logits" "$f" "$nctx" "$out/peer.f32" $ids 2>/dev/null >/dev/null ||
        { echo "| $label | llama.cpp refuses the file |"; return; }
    r=$("$out/arch_compare" "$f" "$nctx" "$out/peer.f32" $ids 2>&1) || { echo "| $label | dhsa: $r |"; return; }
    set -- $r
    echo "| $label | $2 | $4 | $6 | ${9}, ${11} |"
}
echo "| file (48 tokens) | dhsa vs float64 | llama.cpp vs float64 | dhsa vs llama.cpp | argmax = float64 (dhsa, llama.cpp) |"
echo "| --- | --- | --- | --- | --- |"
for a in llama qwen2 qwen3 gemma2 gemma3 phi3; do
    w=""
    case $a in gemma2|gemma3) w="--window 8" ;; esac
    row "$a F32" $a 256 "--type F32 --bias none $w"
    row "$a Q8_0" $a 256 "--type Q8_0 $w"
    row "$a Q4_K" $a 256 "--type Q4_K $w"
    for q in Q8_0 Q4_0 Q6_K Q2_K Q3_K_M Q4_K_M Q5_K_M IQ4_XS; do
        row "$a F32 -> llama-quantize $q" $a 256 "--type F32 $w" $q
    done
done
row "qwen3 F32, q/k/v biases" qwen3 256 "--type F32 --bias qkv"
row "gemma3 F32, window 8, linear x8 (global)" gemma3 256 "--type F32 --window 8 --rope-scale 8"
row "phi3 F32, attn_qkv.bias" phi3 256 "--type F32 --bias qkv"
# original context 16384 / 32 = 512: llama.cpp pads a context to 256, so
# 256 is below it (short factors) and 1024 above (long)
row "phi3 LongRoPE, context 256 (short factors)" phi3 256 "--type F32 --longrope --ctx 16384"
row "phi3 LongRoPE, context 1024 (long factors)" phi3 1024 "--type F32 --longrope --ctx 16384"
