#!/bin/sh
# torch-venv.sh: makes (or reuses) the Python venv in which the PyTorch tests
# of dhsa.torch run (python/tests/test_torch*.py): numpy, pytest, PyTorch and
# Hugging Face transformers from PyPI, at the versions they were tested with.
# The venv also sees the system Python's packages (include-system-site-packages),
# so that the rest of the Python suite finds what .ci/run installed there
# (openai, ...); its own packages come first.
# Usage: sh python/torch-venv.sh DIR     (the Makefile's TORCH_VENV)
# Exit 0 with DIR/bin/python able to import all four; else 1, saying why.
# Measured on this project's 2-core machine (a fresh venv, no pip cache):
# 6 s for the venv, 233 s for numpy + pytest + torch (PyPI's Linux wheel
# pulls the CUDA libraries: 5.6 GB on disk), 34 s for transformers.
set -u
dir=${1:?usage: sh python/torch-venv.sh DIR}
pkgs="numpy pytest torch==2.15.0 transformers==5.24.0"
check='import numpy, pytest, torch, transformers'
cfg="$dir/pyvenv.cfg"
if [ -f "$cfg" ] && grep -q '^include-system-site-packages *= *false' "$cfg"; then
    # a venv made before this script asked for the system's packages
    sed -i 's/^include-system-site-packages *= *false/include-system-site-packages = true/' "$cfg"
fi
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
    exit 0
fi
echo "torch-venv.sh: installing $pkgs into $dir (a few minutes; about 5.6 GB)" >&2
python3 -m venv --system-site-packages "$dir" ||
    { echo "torch-venv.sh: python3 -m venv $dir failed" >&2; exit 1; }
"$dir/bin/python" -m pip install -q $pkgs || { echo "torch-venv.sh: pip install failed" >&2; exit 1; }
"$dir/bin/python" -c "$check" || { echo "torch-venv.sh: installed, but '$check' fails" >&2; exit 1; }
