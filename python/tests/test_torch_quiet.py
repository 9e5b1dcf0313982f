"""test_torch_quiet.py: dhsa.torch._quiet.drop_stderr_lines, which keeps the
PyTorch profiler's "gpuGetDeviceCount failed" line (written by C++ straight
to fd 2 on a machine without a GPU) out of `python -m dhsa.torch.check`.
Needs no PyTorch: a child process writes that line, other lines and a
Python-level line inside the block, at the C level (os.write on fd 2) and
through sys.stderr; only the probe's line may go, the rest must come out
in order. The end-to-end check with PyTorch is in test_torch_find.py.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("q", sys.argv[1])
q = importlib.util.module_from_spec(spec); spec.loader.exec_module(q)
os.write(2, b"before\n")
with q.drop_stderr_lines():
    os.write(2, b"kept 1\n")
    os.write(2, b"ERROR:2026-12-05 10:00:00 123:123 DeviceProperties.cpp:47] gpuGetDeviceCount failed with code 35\n")
    sys.stderr.write("kept 2 (python)\n")
    os.write(2, b"ERROR: a real error\n")
os.write(2, b"after\n")
"""


def run_child(path):
    return subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, timeout=60)


def test_only_the_gpu_probe_line_goes():
    r = run_child(REPO / "python" / "dhsa" / "torch" / "_quiet.py")
    assert r.returncode == 0, r.stderr
    assert r.stderr.decode().splitlines() == ["before", "kept 1", "kept 2 (python)", "ERROR: a real error",
                                              "after"], r.stderr


def test_without_the_filter_the_line_shows(tmp_path):
    """The same child with a drop_stderr_lines that drops nothing: the probe's line is there,
    so the test above would see it if the filter did not work."""
    src = (REPO / "python" / "dhsa" / "torch" / "_quiet.py").read_text()
    f = tmp_path / "q.py"
    f.write_text(src.replace('GPU_PROBE_NOISE = (b"gpuGetDeviceCount failed",)', "GPU_PROBE_NOISE = ()"))
    r = run_child(f)
    assert r.returncode == 0 and b"gpuGetDeviceCount failed" in r.stderr, r.stderr
