#!/bin/sh
# run.sh: the default model's whole pipeline, each step resumable.
#
#   sh train/run.sh setup            Debian text packages, the virtual environment
#                                    (train/.venv, or $DHSA_TRAIN_VENV), the corpus
#   sh train/run.sh train [ARGS]     trains (resumes from train/ckpt/last.pt when it
#                                    exists); ARGS go to train.py (--steps, --init ...)
#   sh train/run.sh export [CKPT]    CKPT (default train/ckpt/last.pt) ->
#                                    models/dhsa-retrieval-8m{,-q8_0}.gguf and
#                                    their greedy test vectors (*.vectors.txt)
#   sh train/run.sh check            torch vs dhsa logits on both files (needs `make`)
#
# Long runs: nohup sh train/run.sh train > train/train.log 2>&1 &
# To continue on a fresh machine from the committed weights:
#   sh train/run.sh setup && sh train/run.sh train --init models/dhsa-retrieval-8m.gguf \
#       --init-step STEP --steps NEW_TOTAL
# (STEP is the file's dhsa.train.step; `build/dhsa inspect` shows it).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
venv=${DHSA_TRAIN_VENV:-$here/.venv}
py="$venv/bin/python"
name=dhsa-retrieval-8m
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
setup)
    need=""
    for p in dict-gcide dict-jargon dict-foldoc dict-devil fortunes fortunes-min; do
        dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
    done
    if [ -n "$need" ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need
    fi
    [ -x "$py" ] || python3 -m venv "$venv"
    "$py" -m pip install -q -r "$here/requirements.txt"
    "$py" "$here/corpus.py" "$here/work"
    ;;
train)
    cd "$here"
    exec "$py" train.py "$@"
    ;;
export)
    ck=$(cd "$(dirname "${1:-$here/ckpt/last.pt}")" && pwd)/$(basename "${1:-last.pt}")
    cd "$here"
    "$py" export.py "$ck" tok2048.model "$root/models/$name.gguf" --type f16
    "$py" export.py "$ck" tok2048.model "$root/models/$name-q8_0.gguf" --type q8_0
    "$py" vectors.py "$root/models/$name.gguf" tok2048.model "$root/models/$name.vectors.txt"
    "$py" vectors.py "$root/models/$name-q8_0.gguf" tok2048.model "$root/models/$name-q8_0.vectors.txt"
    sha256sum "$root/models/$name.gguf" "$root/models/$name-q8_0.gguf"
    ;;
check)
    cd "$here"
    for f in "$root/models/$name.gguf" "$root/models/$name-q8_0.gguf"; do
        "$py" check_logits.py "$f" tok2048.model --dhsa "$root/build/dhsa" --logits "$root/build/progs/logits"
    done
    ;;
*)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    [ -z "$cmd" ] && exit 2
    echo "run.sh: unknown step \"$cmd\"" >&2
    exit 2
    ;;
esac
