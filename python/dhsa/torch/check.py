"""check.py: `python -m dhsa.torch.check FILE.py:FACTORY`, the CI guard.

Loads FILE.py, calls FACTORY() and runs find_square_intermediates on what
it returns: `(module, args)`, `(module, args, kwargs)` or `(module, x)`,
where args is a tuple or list of positional inputs, kwargs a dict, and a
lone tensor x the only input. Prints the findings and exits with

  0  nothing square of at least --min-size elements was built,
  1  something was (the findings are listed),
  2  the command line, the file, the factory or the forward failed (said why).

Options: --min-size N (elements, default 1024), --quiet (findings only, no
notes), --device DEV (move the module and tensor inputs to DEV, e.g. cuda,
first; CUDA/XPU operators and allocations are recorded as the CPU's).
The production-mode notes (a module in training mode, grad mode on) go to
stderr. Tested by python/tests/test_torch_find.py.
"""

import argparse
import importlib.util
import os
import sys
import warnings

USAGE_EXIT, FOUND_EXIT = 2, 1


def _fail(msg):
    sys.stderr.write("dhsa.torch.check: %s\n" % msg)
    return USAGE_EXIT


def _load_factory(spec):
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError("expected FILE.py:FACTORY, got %r" % spec)
    if not os.path.isfile(path):
        raise ValueError("%s: no such file" % path)
    modname = "_dhsa_check_" + "".join(c if c.isalnum() else "_" for c in os.path.abspath(path))
    sp = importlib.util.spec_from_file_location(modname, path)
    if sp is None or sp.loader is None:
        raise ValueError("%s: not a Python file that can be imported" % path)
    mod = importlib.util.module_from_spec(sp)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # its neighbours import
    sys.modules[modname] = mod
    sp.loader.exec_module(mod)
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ValueError("%s has no callable %r" % (path, name))
    return fn


def _split(made, torch):
    """(module, args tuple, kwargs dict) from what the factory returned."""
    if not isinstance(made, (tuple, list)) or len(made) not in (2, 3):
        raise ValueError("the factory must return (module, args) or (module, args, kwargs), got %s"
                         % type(made).__name__)
    module, args = made[0], made[1]
    kwargs = made[2] if len(made) == 3 else {}
    if not isinstance(module, torch.nn.Module):
        raise ValueError("the factory's first value must be a torch.nn.Module, got %s"
                         % type(module).__name__)
    if isinstance(args, torch.Tensor):
        args = (args,)
    elif isinstance(args, dict) and len(made) == 2:
        args, kwargs = (), args
    elif not isinstance(args, (tuple, list)):
        raise ValueError("the factory's inputs must be a tensor, a tuple/list of positional "
                         "inputs or a dict of keyword inputs, got %s" % type(args).__name__)
    if not isinstance(kwargs, dict):
        raise ValueError("the factory's third value must be a dict of keyword inputs, got %s"
                         % type(kwargs).__name__)
    return module, tuple(args), kwargs


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m dhsa.torch.check",
        description="Run a model's forward once in eval() under torch.inference_mode() and list "
                    "every operator output that is square in its last two dimensions (or "
                    "sequence length x sequence length). Exit 1 if any, 0 if none, 2 on errors.")
    ap.add_argument("target", metavar="FILE.py:FACTORY",
                    help="a Python file and a function in it returning (module, args[, kwargs])")
    ap.add_argument("--min-size", type=int, default=1024, metavar="N",
                    help="elements a tensor must have to count (default 1024)")
    ap.add_argument("--quiet", action="store_true", help="no notes, only the findings")
    ap.add_argument("--device", metavar="DEV", default=None,
                    help="move the module and its tensor inputs to DEV (e.g. cuda) before the "
                         "check; default: where the factory put them")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    if a.min_size < 1:
        return _fail("--min-size must be a positive integer, not %d" % a.min_size)
    try:
        import torch
    except Exception as e:
        return _fail("PyTorch is not importable here (%s): install it (pip install torch)" % e)
    from ._find import ProductionModeWarning, find_square_intermediates
    try:
        module, args, kwargs = _split(_load_factory(a.target)(), torch)
    except Exception as e:
        return _fail("%s: %s: %s" % (a.target, type(e).__name__, e))
    if a.device is not None:
        try:
            dev = torch.device(a.device)
            module = module.to(dev)
            mv = lambda x: x.to(dev) if isinstance(x, torch.Tensor) else x  # noqa: E731
            args = tuple(mv(x) for x in args)
            kwargs = {k: mv(v) for k, v in kwargs.items()}
        except Exception as e:
            return _fail("--device %s: %s: %s" % (a.device, type(e).__name__, e))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProductionModeWarning)  # printed below, once
            found = find_square_intermediates(module, *args, min_size=a.min_size, **kwargs)
    except Exception as e:
        return _fail("the forward of %s failed: %s: %s" % (type(module).__name__,
                                                           type(e).__name__, e))
    if not a.quiet:
        for n in found.notes:
            sys.stderr.write("note: %s\n" % n)
    found.notes = []
    print("%s: %s" % (a.target, found))
    return FOUND_EXIT if found else 0


if __name__ == "__main__":
    sys.exit(main())
