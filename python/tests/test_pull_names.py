"""Model("NAME"): a catalog name resolves as the CLI's -m NAME does
(python/dhsa/_runner.py resolve_model; docs/models.md)."""
import os

import pytest

from dhsa import _runner

SHA = "0" * 64


def _catalog(tmp_path, monkeypatch):
    cat = tmp_path / "catalog"
    cat.write_text("# test\n[tiny]\nfile = tiny.gguf\nsize = 5\nsha256 = %s\nlicence = x\n"
                   "part = a==1 a/b 5 -\n\n[shipped]\nrepo = shipped.gguf\nsize = 1\nsha256 = %s\nlicence = x\n"
                   % (SHA, SHA))
    monkeypatch.setenv("DHSA_CATALOG", str(cat))
    monkeypatch.setenv("DHSA_MODELS", str(tmp_path / "cache"))
    return tmp_path


def test_name_not_pulled_says_the_pull_command(tmp_path, monkeypatch):
    _catalog(tmp_path, monkeypatch)
    with pytest.raises(FileNotFoundError, match="dhsa pull tiny"):
        _runner.resolve_model("tiny")
    with pytest.raises(FileNotFoundError, match="dhsa pull tiny"):
        _runner.Model("tiny")


def test_pulled_name_is_the_cached_file(tmp_path, monkeypatch):
    _catalog(tmp_path, monkeypatch)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tiny.gguf").write_bytes(b"12345")
    assert _runner.resolve_model("tiny") == str(tmp_path / "cache" / "tiny.gguf")
    (tmp_path / "cache" / "tiny.gguf").write_bytes(b"123")  # wrong size: pull again
    with pytest.raises(FileNotFoundError, match="the catalog says 5"):
        _runner.resolve_model("tiny")


def test_paths_and_other_names_pass_through(tmp_path, monkeypatch):
    _catalog(tmp_path, monkeypatch)
    assert _runner.resolve_model("dir/tiny") == "dir/tiny"
    assert _runner.resolve_model("not-in-catalog") == "not-in-catalog"
    assert _runner.resolve_model("shipped") == "shipped.gguf"  # relative to the current folder


def test_the_repository_catalog_has_the_shipped_model(monkeypatch):
    monkeypatch.delenv("DHSA_CATALOG", raising=False)
    path = _runner.resolve_model("dhsa-retrieval-8m")
    assert os.path.isfile(path) and path.endswith("models/dhsa-retrieval-8m.gguf")
