"""_quiet.py: keeps the PyTorch profiler's GPU probe out of a correct run's
stderr. On a machine without a GPU driver, PyTorch's CUDA wheel (with CUPTI)
probes the devices when the profiler starts and its C++ logger (kineto)
writes "ERROR:<date> ... gpuGetDeviceCount failed with code N" straight to
file descriptor 2, though dhsa.torch profiles the CPU only and nothing
failed. Python cannot reach that logger, so while the profiler starts and
stops, fd 2 goes to a temporary file; then every line is written back except
those naming the probe. Other output, errors included, is kept, in order.

Imports no PyTorch (dhsa.torch's rule); tested by python/tests/test_torch_quiet.py.
"""

import os
import sys
import tempfile

# What the profiler writes when it finds no GPU: only lines with one of these go.
GPU_PROBE_NOISE = (b"gpuGetDeviceCount failed",)


class drop_stderr_lines:
    """with drop_stderr_lines(patterns): fd 2 (C and Python writes alike) is
    held for the block, then written back without the lines that contain
    any of patterns (bytes)."""

    def __init__(self, patterns=GPU_PROBE_NOISE):
        self.patterns = tuple(patterns)
        self.saved = None

    def __enter__(self):
        try:
            sys.stderr.flush()
            self.tmp = tempfile.TemporaryFile()
            self.saved = os.dup(2)
            os.dup2(self.tmp.fileno(), 2)
        except (OSError, ValueError):
            self.saved = None  # no fd 2 to hold (closed, or not a real file): leave it alone
        return self

    def __exit__(self, *exc):
        if self.saved is None:
            return False
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.saved = None
        self.tmp.seek(0)
        data = self.tmp.read()
        self.tmp.close()
        kept = b"".join(line for line in data.splitlines(keepends=True)
                        if not any(p in line for p in self.patterns))
        while kept:
            n = os.write(2, kept)
            kept = kept[n:]
        return False
