#!/bin/sh
# bench/attn.sh: the dense-attention tables of docs/notes/results-attention.md, regenerated.
# Usage: sh bench/attn.sh [speed|decode|memory|all] (default all); needs
# build/dhsa (make). Prints markdown tables; each row is one
# `build/dhsa bench attn ... --json` run, the command is printed above.
# Takes about 3 minutes on 2 cores.
set -eu
cd "$(dirname "$0")/.."
DHSA=${DHSA:-build/dhsa}
what=${1:-all}

# key VALUE from a one-line JSON object on stdin
get() { sed -E "s/.*\"$1\": \"?([^,\"}]*)\"?.*/\1/"; }
# A / B (awk understands 6.7e+07)
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6g", a / b }'; }

speed() {
    echo "Command: $DHSA bench attn --L L --heads 8 --kv-heads 8 --dim D [--causal] --threads 2 --runs 5 --json"
    echo
    echo "| L | dim | causal | median ms | GFLOP/s | measured peak GFLOP/s | peak_fraction | workspace | max_abs_err |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for L in 4096 8192; do for D in 128 64; do for C in "" --causal; do
        j=$($DHSA bench attn --L $L --heads 8 --kv-heads 8 --dim $D $C --threads 2 --runs 5 --json)
        printf '| %s | %s | %s | %.1f | %.1f | %.1f | %.3f | %s | %.2g |\n' $L $D "${C:+yes}" \
            "$(echo "$j" | get median_ms)" "$(echo "$j" | get gflops)" "$(echo "$j" | get peak_gflops)" \
            "$(echo "$j" | get peak_fraction)" "$(echo "$j" | get workspace_bytes)" "$(echo "$j" | get max_abs_err)"
    done; done; done
}

decode() {
    echo "Command: $DHSA bench attn --L L --Lq 1 --heads 32 --kv-heads 8 --dim 128 --threads 2 --runs 9 [--dtype T] --json"
    echo
    echo "| L | dtype | median ms | K/V GB/s | plain read of same K/V, GB/s | bandwidth_fraction (median per-run ratio) | 1 GiB read GB/s | K/V GB/s / 1 GiB read |"
    echo "|---|---|---|---|---|---|---|---|"
    for L in 32768 131072; do for T in f32 f16; do
        j=$($DHSA bench attn --L $L --Lq 1 --heads 32 --kv-heads 8 --dim 128 --dtype $T --threads 2 --runs 9 --json)
        kv=$(echo "$j" | get kv_gbps); rd=$(echo "$j" | get read_gbps)
        printf '| %s | %s | %.2f | %.2f | %.2f | %.3f | %.2f | %.3f |\n' $L $T \
            "$(echo "$j" | get median_ms)" "$kv" "$(echo "$j" | get kv_plain_read_gbps)" \
            "$(echo "$j" | get bandwidth_fraction)" "$rd" "$(div "$kv" "$rd")"
    done; done
}

memory() {
    echo "Command: $DHSA bench attn --L L --heads 8 --kv-heads 8 --dim 128 --causal --threads 2 --runs 3 --json"
    echo
    echo "| L | Q/K/V/O MiB | peak RSS MiB | extra RSS above inputs KiB | workspace bytes | ctx peak bytes |"
    echo "|---|---|---|---|---|---|"
    for L in 4096 8192 16384 32768; do
        j=$($DHSA bench attn --L $L --heads 8 --kv-heads 8 --dim 128 --causal --threads 2 --runs 3 --json)
        printf '| %s | %.1f | %.1f | %.0f | %s | %s |\n' $L \
            "$(div "$(echo "$j" | get qkvo_bytes)" 1048576)" \
            "$(div "$(echo "$j" | get peak_rss_bytes)" 1048576)" \
            "$(div "$(echo "$j" | get extra_rss_bytes)" 1024)" \
            "$(echo "$j" | get workspace_bytes)" "$(echo "$j" | get ctx_peak_bytes)"
    done
}

case $what in
speed) speed ;;
decode) decode ;;
memory) memory ;;
all) speed; echo; decode; echo; memory ;;
*) echo "usage: sh bench/attn.sh [speed|decode|memory|all]" >&2; exit 2 ;;
esac
