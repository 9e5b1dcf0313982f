"""dhsa_build_backend.py: the PEP 517 build backend of pyproject.toml.

`pip install .` (or `pip wheel .`) from the repository root calls
build_wheel() here: it runs the project's Makefile to build libdhsa.so
(`make build/libdhsa.so`, incremental: an already built tree is reused), then
writes a wheel holding the pure-Python package python/dhsa, the library as
dhsa/libdhsa.so and the default model as dhsa/models/dhsa-retrieval-8m.gguf
(so that dhsa.Model() works from any directory, as `dhsa run` without -m does
in a checkout). The binding is ctypes, not a compiled extension, so the wheel
is tagged py3-none-<platform>: any CPython 3 on this OS and CPU.

Why not setuptools: it would need the `wheel` package (setuptools < 70.1) or
a recent setuptools from PyPI for every isolated build; this backend needs
only the standard library and `make` + a C compiler, so `pip install .` works
offline, with or without build isolation.

Settings (environment): DHSA_MAKE (default `make`), DHSA_MAKE_JOBS (default:
the CPU count), DHSA_BUILD_DIR (default build/, the Makefile's BUILD).
Tested by python/tests/test_pip_install.py (docs/python.md, "Install").
"""

import base64
import hashlib
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "dhsa"
MODEL = "dhsa-retrieval-8m.gguf"  # tools/cli.h DHSA_DEFAULT_MODEL


def _version():
    """DHSA_VERSION of include/dhsa.h: one version for the C library and the package."""
    m = re.search(r'#define\s+DHSA_VERSION\s+"([^"]+)"', (ROOT / "include" / "dhsa.h").read_text())
    if not m:
        raise RuntimeError("include/dhsa.h has no DHSA_VERSION")
    return m.group(1)


def _tag():
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-" + plat


def _build_library():
    """Runs the Makefile; returns the path of the built libdhsa.so."""
    build = os.environ.get("DHSA_BUILD_DIR", "build")
    target = "%s/libdhsa.so" % build
    env = dict(os.environ)
    # A make that runs pip (make test) passes its jobserver and its command-line
    # variables (BUILD=build-asan, EXTRA_CFLAGS=...) through MAKEFLAGS: they must
    # not leak into the library the wheel ships.
    for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
        env.pop(k, None)
    jobs = os.environ.get("DHSA_MAKE_JOBS") or str(os.cpu_count() or 1)
    cmd = [os.environ.get("DHSA_MAKE", "make"), "-C", str(ROOT), "-j" + jobs, "BUILD=" + build, target]
    print("dhsa build: " + " ".join(cmd), file=sys.stderr)
    r = subprocess.run(cmd, env=env)
    if r.returncode != 0:
        raise RuntimeError("dhsa build: `%s` failed (exit %d): libdhsa needs a C11 compiler and make"
                           % (" ".join(cmd), r.returncode))
    lib = ROOT / target
    if not lib.is_file():
        raise RuntimeError("dhsa build: make succeeded but %s is missing" % lib)
    return lib


def _metadata(version):
    readme = ROOT / "docs" / "python.md"
    text = ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
            "Summary: Memory-bounded and DHSA sparse attention, and a GGUF model runner (C library + ctypes binding)\n"
            "Requires-Python: >=3.8\nRequires-Dist: numpy\n" % (NAME, version))
    if readme.is_file():
        text += "Description-Content-Type: text/markdown\n\n" + readme.read_text()
    return text


def _files():
    """(path in the wheel, path on disk) of the package's Python sources."""
    pkg = ROOT / "python" / NAME
    out = []
    for p in sorted(pkg.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        out.append((NAME + "/" + p.relative_to(pkg).as_posix(), p))
    return out


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arc, digest, len(data))


def _dist_info(version):
    return "%s-%s.dist-info" % (NAME, version)


def _write_metadata_dir(directory, version):
    d = Path(directory) / _dist_info(version)
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(_metadata(version))
    (d / "WHEEL").write_text(_wheel_file())
    (d / "top_level.txt").write_text(NAME + "\n")
    return d.name


def _wheel_file():
    return ("Wheel-Version: 1.0\nGenerator: dhsa_build_backend\nRoot-Is-Purelib: false\nTag: %s\n" % _tag())


# ------------------------------------------------------------ PEP 517 hooks ---

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_metadata_dir(metadata_directory, _version())


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    lib = _build_library()
    model = ROOT / "models" / MODEL
    if not model.is_file():
        raise RuntimeError("dhsa build: the default model %s is missing" % model)
    entries = [(arc, p.read_bytes()) for arc, p in _files()]
    entries.append((NAME + "/libdhsa.so", lib.read_bytes()))
    entries.append((NAME + "/models/" + MODEL, model.read_bytes()))
    readme = ROOT / "models" / "README.md"
    if readme.is_file():
        entries.append((NAME + "/models/README.md", readme.read_bytes()))
    catalog = ROOT / "models" / "catalog"  # Model("NAME") of a pulled model (docs/models.md)
    if catalog.is_file():
        entries.append((NAME + "/models/catalog", catalog.read_bytes()))
    di = _dist_info(version)
    entries.append((di + "/METADATA", _metadata(version).encode()))
    entries.append((di + "/WHEEL", _wheel_file().encode()))
    entries.append((di + "/top_level.txt", (NAME + "\n").encode()))
    name = "%s-%s-%s.whl" % (NAME, version, _tag())
    final = Path(wheel_directory) / name
    tmp = final.with_name(name + ".tmp")
    record = [_record_line(arc, data) for arc, data in entries] + [di + "/RECORD,,"]
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if arc.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
        info = zipfile.ZipInfo(di + "/RECORD", date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        z.writestr(info, "\n".join(record) + "\n")
    os.replace(tmp, final)
    return name
