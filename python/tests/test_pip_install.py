"""test_pip_install.py: `pip install .` from the repository root into a fresh
venv, then `import dhsa; dhsa.Model()` from another directory, with nothing
pointing at the checkout (no DHSA_LIB, DHSA_MODEL or PYTHONPATH): the library
and the default model must come from inside the installed package
(pyproject.toml, python/dhsa_build_backend.py, docs/python.md "Install").

The venv sees the system's packages (numpy) and pip runs with --no-index, so
nothing is downloaded; the backend needs no package from PyPI. The library is
built by the Makefile in the checkout's build directory (the one DHSA_LIB
names under `make test`), so an already built tree makes this a few seconds.
Skips, saying why, where the venv module or pip is missing.
"""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("DHSA_LIB", "DHSA_MODEL", "PYTHONPATH", "PYTHONHOME",
                        "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _build_dir():
    """The Makefile BUILD the suite was built in (DHSA_LIB's folder when it is in this checkout)."""
    lib = os.environ.get("DHSA_LIB")
    if lib:
        d = Path(lib).resolve().parent
        try:
            return str(d.relative_to(REPO))
        except ValueError:
            pass
    return "build"


def _pip_has_python_option():
    """pip >= 22.3 installs into another interpreter (`pip --python PY`)."""
    r = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
    parts = r.stdout.split()
    if r.returncode != 0 or len(parts) < 2:
        return None
    try:
        major, minor = (int(x) for x in parts[1].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (22, 3)


def _venv(tmp_path):
    """A fresh venv that sees the system's packages, and the pip command that
    installs into it. Where this pip can target another interpreter the venv
    is made without pip of its own (ensurepip takes 20 s on a loaded 2-core
    machine, the rest of the test about 10 s); else it gets its own."""
    venv = tmp_path / "venv"
    has = _pip_has_python_option()
    if has is None:
        pytest.skip("%s has no pip (-m pip --version fails); Debian: apt-get install python3-pip"
                    % sys.executable)
    cmd = [sys.executable, "-m", "venv", "--system-site-packages"] + (["--without-pip"] if has else []) + [str(venv)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("cannot make a venv here (%s: %s); Debian: apt-get install python3-venv"
                    % (" ".join(cmd), (r.stderr or r.stdout).strip().splitlines()[-1:]))
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py)] if has else [str(py), "-m", "pip"]
    return venv, py, pip


def test_pip_install_then_model_from_elsewhere(tmp_path):
    venv, py, pip = _venv(tmp_path)
    env = _clean_env()
    env["DHSA_BUILD_DIR"] = _build_dir()
    env["DHSA_MAKE_JOBS"] = "2"
    r = subprocess.run(pip + ["install", "--no-index", "-q", "."],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, "pip install . failed:\n" + r.stdout[-3000:] + r.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env()
    code = ("import dhsa\n"
            "m = dhsa.Model()\n"
            "print(dhsa.__file__)\n"
            "print(dhsa.lib_path())\n"
            "print(m.path)\n"
            "ids = m.tokenize('The pass key is 40913.')\n"
            "print(len(ids), m.detokenize(ids))\n"
            "print(repr(dhsa.Session(m, ctx=64).generate('Once upon a time', max_tokens=4, temperature=0)))\n"
            "print(dhsa.Model('dhsa-retrieval-8m').path)\n")  # a catalog name (the bundled models/catalog)
    r = subprocess.run([str(py), "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, "import dhsa; dhsa.Model() failed:\n" + r.stdout + r.stderr
    pkg_file, lib, model, tok, gen = r.stdout.strip().splitlines()[:5]
    site = str(venv.resolve())
    for what, path in (("dhsa", pkg_file), ("libdhsa.so", lib), ("the default model", model)):
        assert str(Path(path).resolve()).startswith(site), "%s came from %s, not the venv %s" % (what, path, site)
    assert Path(lib).name == "libdhsa.so" and Path(model).name == "dhsa-retrieval-8m.gguf"
    assert tok.split(" ", 1)[1] == "The pass key is 40913.", tok
    assert len(eval(gen)) > 0, gen
    by_name = r.stdout.strip().splitlines()[5]
    assert Path(by_name).resolve() == Path(model).resolve(), "Model('dhsa-retrieval-8m') opened " + by_name


def test_wheel_contents(tmp_path):
    """`pip wheel .`'s wheel: the package, the library, the model and a RECORD that covers them."""
    sys.path.insert(0, str(REPO / "python"))
    try:
        import dhsa_build_backend as backend
    finally:
        sys.path.pop(0)
    saved = {k: os.environ.get(k) for k in ("DHSA_BUILD_DIR", "DHSA_MAKE_JOBS")}
    os.environ["DHSA_BUILD_DIR"], os.environ["DHSA_MAKE_JOBS"] = _build_dir(), "2"
    try:
        name = backend.build_wheel(str(tmp_path))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert name.startswith("dhsa-") and name.endswith(".whl") and "-py3-none-" in name, name
    with zipfile.ZipFile(tmp_path / name) as z:
        names = set(z.namelist())
        record = z.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
    for need in ("dhsa/__init__.py", "dhsa/_capi.py", "dhsa/torch/check.py", "dhsa/libdhsa.so",
                 "dhsa/models/dhsa-retrieval-8m.gguf"):
        assert need in names, "%s missing from %s" % (need, name)
    assert not any("__pycache__" in n for n in names)
    recorded = {line.split(",")[0] for line in record.splitlines() if line}
    assert recorded == names, "RECORD and the wheel differ: %s" % (recorded ^ names)
