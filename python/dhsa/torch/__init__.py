"""dhsa.torch: PyTorch tools. Find the operators of a model that build
square (L x L) attention intermediates, and replace the attention that
builds them: dhsa's tiled kernels on CPU tensors, PyTorch's own kernels
(SDPA with the masks turned right; DHSA routed by torch ops, its sparse
attention through FlexAttention on CUDA, gathered per query block elsewhere)
on any other device or with backend="torch".

    from dhsa.torch import find_square_intermediates
    print(find_square_intermediates(model, x, key_padding_mask=pad))

    python -m dhsa.torch.check FILE.py:FACTORY     # exit 1 when something is found

    dhsa.torch.MultiheadAttention              drop-in for nn.MultiheadAttention
    dhsa.torch.replace_multihead_attention(m)  swaps every instance in place
    dhsa.torch.scaled_dot_product_attention    F.scaled_dot_product_attention (+ sparse=)
    dhsa.torch.patch_transformers(model, method="dhsa", density=0.0625)
    dhsa.torch.router_params(model, n)         the routing its calls over n keys run
    dhsa.torch.route(q, k, causal=True, density=0.0625)   DHSA routing in torch ops
                                                          (any device; dhsa.route's layout)

`import dhsa.torch` does not import PyTorch; the first use of a name above
does (PEP 562 module __getattr__), and raises ImportError saying so when
PyTorch is not importable. `import dhsa` never imports this package.
Contract and design choices: docs/torch.md. Tests: python/tests/test_torch_*.py.
"""

import importlib

_EXPORTS = {
    "find_square_intermediates": "_find",
    "Finding": "_find",
    "Findings": "_find",
    "ProductionModeWarning": "_find",
    "MultiheadAttention": "_mha",
    "replace_multihead_attention": "_mha",
    "scaled_dot_product_attention": "_ops",
    "patch_transformers": "_hf",
    "unpatch_transformers": "_hf",
    "model_stats": "_hf",
    "router_params": "_hf",
    "route": "_route",
    "TorchLayout": "_route",
}

__all__ = sorted(_EXPORTS)


def require_torch():
    """The torch module, or ImportError naming what is missing."""
    try:
        import torch
    except Exception as e:  # not installed, or installed but broken
        raise ImportError("dhsa.torch needs PyTorch, which is not importable here (%s); install "
                          "it (pip install torch) or run `make test-torch`, which makes a venv "
                          "with it" % e) from e
    return torch


def __getattr__(name):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError("module 'dhsa.torch' has no attribute %r" % name)
    require_torch()
    value = getattr(importlib.import_module("." + mod, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
