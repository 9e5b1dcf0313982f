"""test_torch_find.py: dhsa.torch.find_square_intermediates and its CLI
(python -m dhsa.torch.check), where PyTorch is importable (skipped, saying
why, otherwise; `make test-torch` runs them in a venv that has it).

What must hold (issue 15): on the installed PyTorch the finder flags
nn.MultiheadAttention with a key_padding_mask and nn.TransformerEncoderLayer
with a src_key_padding_mask (the [B, H, P, P] scores of their fast paths),
flags nothing on F.scaled_dot_product_attention, says loudly when the
caller's module was in training mode or grad mode was on, and the CLI exits
1 and 0 accordingly. Shapes and bytes are checked against what the
operators must build, so a finder that reports the wrong thing fails.
"""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from conftest import REPO

try:
    import torch
except Exception as e:  # not installed, or installed but broken
    pytest.skip("PyTorch is not importable: %s (make test-torch makes a venv with it)" % e,
                allow_module_level=True)

from dhsa.torch import ProductionModeWarning, find_square_intermediates  # noqa: E402

F = torch.nn.functional
B, P, E, H = 2, 48, 64, 4


def pad_mask(b=B, p=P, n=5):
    m = torch.zeros(b, p, dtype=torch.bool)
    m[:, p - n:] = True  # True = padding (key_padding_mask)
    return m


def find(module, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProductionModeWarning)
        return find_square_intermediates(module, *args, **kwargs)


class SDPA(torch.nn.Module):
    def forward(self, q, k, v, attn_mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


class Explicit(torch.nn.Module):
    """Attention written out: q k^T, softmax, returns the weights too."""

    def forward(self, q, k, v):
        w = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        return w @ v, w


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.ModuleDict({
            "attn": torch.nn.MultiheadAttention(E, H, batch_first=True)}) for _ in range(2)])

    def forward(self, x, pad):
        for b in self.blocks:
            x = x + b["attn"](x, x, x, key_padding_mask=pad, need_weights=False)[0]
        return x


def test_mha_with_key_padding_mask_is_flagged():
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    x = torch.randn(B, P, E)
    found = find(mha, x, x, x, key_padding_mask=pad_mask(), need_weights=False)
    big = [f for f in found if f.shape == (B, H, P, P)]
    assert big, "no [B, H, P, P] finding in:\n%s" % found
    for f in big:
        assert f.nbytes == B * H * P * P * 4, str(f)
        assert f.dtype == "torch.float32" and f.module == "" and f.module_type == "MultiheadAttention"
        assert f.op.startswith("aten::") and f.op not in ("aten::empty", "aten::empty_like"), str(f)
    assert "[2, 4, 48, 48]" in str(found) and "MultiheadAttention" in str(found)


def test_transformer_encoder_layer_is_flagged():
    layer = torch.nn.TransformerEncoderLayer(E, H, dim_feedforward=96, batch_first=True).eval()
    found = find(layer, torch.randn(B, P, E), src_key_padding_mask=pad_mask())
    assert any(f.shape == (B, H, P, P) and f.nbytes == B * H * P * P * 4 for f in found), str(found)


def test_sdpa_is_not_flagged():
    q = torch.randn(B, H, P, 16)
    assert not find(SDPA(), q, q, q), "SDPA built something square"
    keep = ~pad_mask()[:, None, None, :]  # SDPA's bool mask: True = take part
    assert not find(SDPA(), q, q, q, attn_mask=keep)


def test_explicit_attention_and_returned_weights():
    q = torch.randn(B, H, P, 16)
    found = find(Explicit(), q, q, q)
    assert len(found) >= 2, str(found)
    ops = [f.op for f in found]
    assert any("softmax" in o for o in ops), ops
    assert all(f.shape == (B, H, P, P) for f in found), str(found)
    # the softmax output is read by the matmul and returned
    assert any("softmax" in f.op for f in found)
    # below min_size: nothing
    assert not find(Explicit(), q, q, q, min_size=B * H * P * P + 1)
    assert find(Explicit(), q, q, q, min_size=B * H * P * P)


def test_cross_lengths_and_no_false_positive_when_P_equals_E():
    # [B, H, Lq, Lk] with Lq != Lk: both are sequence lengths of the inputs
    q, k = torch.randn(B, H, 40, 16), torch.randn(B, H, 56, 16)
    found = find(Explicit(), q, k, k)
    assert any(f.shape == (B, H, 40, 56) for f in found), str(found)
    # activations [B, P, E] with P == E are not attention: not reported
    lin = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    assert not find(lin, torch.randn(B, 64, 64)), "a P == E activation was reported"


def test_module_paths():
    found = find(Blocks(), torch.randn(B, P, E), pad_mask())
    mods = {f.module for f in found}
    assert {"blocks.0.attn", "blocks.1.attn"} <= mods, mods


def test_training_mode_and_grad_mode_are_announced_and_restored():
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True)  # training mode by default
    x = torch.randn(B, P, E)
    with pytest.warns(ProductionModeWarning, match="training mode") as rec:
        found = find_square_intermediates(mha, x, x, x, key_padding_mask=pad_mask(),
                                          need_weights=False)
    assert any("grad mode was on" in str(w.message) for w in rec), [str(w.message) for w in rec]
    assert mha.training and mha.out_proj.training, "training flags not restored"
    # checked in eval() all the same: the fast path's tensors are there
    assert any(f.shape == (B, H, P, P) for f in found), str(found)
    assert len(found.notes) == 2 and "note: " in str(found)
    mha.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProductionModeWarning)
        with torch.inference_mode():
            found = find_square_intermediates(mha, x, x, x, key_padding_mask=pad_mask(),
                                              need_weights=False)
    assert not found.notes


def test_bad_arguments():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        find_square_intermediates(lambda x: x, torch.zeros(1))
    with pytest.raises(ValueError, match="min_size"):
        find(SDPA(), torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 4),
             min_size=0)

# ----------------------------------------------------------------- CLI ---


FACTORIES = textwrap.dedent("""
    import torch
    B, P, E, H = 2, 48, 64, 4

    def mha():
        m = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
        x = torch.randn(B, P, E)
        pad = torch.zeros(B, P, dtype=torch.bool); pad[:, -5:] = True
        return m, (x, x, x), dict(key_padding_mask=pad, need_weights=False)

    def layer():
        m = torch.nn.TransformerEncoderLayer(E, H, dim_feedforward=96, batch_first=True).eval()
        pad = torch.zeros(B, P, dtype=torch.bool); pad[:, -5:] = True
        return m, (torch.randn(B, P, E),), dict(src_key_padding_mask=pad)

    class S(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    def sdpa():
        q = torch.randn(B, H, P, 16)
        return S(), (q, q, q)

    def broken():
        return "not a module", ()

    def dhsa_mha():
        import dhsa.torch
        m, args, kw = mha()
        return dhsa.torch.MultiheadAttention.from_module(m), args, kw
""")


def run_check(tmp_path, target, *extra, module="check"):
    """`python -m dhsa.torch.MODULE FILE:TARGET ...` in a fresh process."""
    f = tmp_path / "factories.py"
    f.write_text(FACTORIES)
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    return subprocess.run([sys.executable, "-m", "dhsa.torch." + module,
                           "%s:%s" % (f, target)] + list(extra),
                          capture_output=True, text=True, env=env, timeout=300)


def check_here(tmp_path, capsys, target, *extra):
    """check.main() in this process (each fresh process imports PyTorch
    again: seconds): (exit status, stdout, stderr)."""
    from dhsa.torch import check
    f = tmp_path / "factories.py"
    f.write_text(FACTORIES)
    rc = check.main(["%s:%s" % (f, target)] + list(extra))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_exit_codes(tmp_path, capsys):
    r = run_check(tmp_path, "mha")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "[2, 4, 48, 48]" in r.stdout and "square intermediate" in r.stdout
    # a correct run's stderr has no profiler noise (dhsa/torch/_quiet.py)
    assert "gpuGetDeviceCount" not in r.stderr, r.stderr
    r = run_check(tmp_path, "sdpa", module="find")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "no square intermediate" in r.stdout
    assert "training mode" in r.stderr  # S() was never put in eval()
    rc, out, _ = check_here(tmp_path, capsys, "layer")
    assert rc == 1 and "TransformerEncoderLayer" in out, out
    rc, out, _ = check_here(tmp_path, capsys, "mha", "--min-size", str(2 * 4 * 48 * 48 + 1))
    assert rc == 0, out


def test_import_dhsa_does_not_import_torch():
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    code = ("import sys, dhsa, dhsa.torch; assert 'torch' not in sys.modules, 'imported torch'; "
            "dhsa.torch.find_square_intermediates; assert 'torch' in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_cli_errors(tmp_path, capsys):
    rc, _, err = check_here(tmp_path, capsys, "broken")
    assert rc == 2 and "torch.nn.Module" in err, err
    rc, _, err = check_here(tmp_path, capsys, "nothere")
    assert rc == 2 and "no callable 'nothere'" in err, err
    rc, _, err = check_here(tmp_path, capsys, "mha", "--min-size", "0")
    assert rc == 2 and "--min-size" in err, err
    from dhsa.torch import check
    assert check.main(["nocolon"]) == 2
    assert "FILE.py:FACTORY" in capsys.readouterr().err
