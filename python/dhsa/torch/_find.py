"""_find.py: find_square_intermediates(), the operator-level search for
tensors that grow as L x L (attention scores, masks, softmax outputs).

Contract (docs/torch.md, "Finding square intermediates"):
  - One forward of `module(*args, **kwargs)` in eval() and under
    torch.inference_mode(), whatever the caller's state; a submodule in
    training mode or grad mode being on is announced with a
    ProductionModeWarning (and kept in Findings.notes), and the training
    flags are restored afterwards.
  - Every tensor an operator allocates during that forward is a candidate,
    including the operators that run inside fused C++ kernels
    (aten::_native_multi_head_attention calls aten::bmm and
    aten::_masked_softmax): the PyTorch profiler sees those, a
    TorchDispatchMode does not. A candidate is reported when some operator
    reads it or a module returns it, with the shape of that view, and:
      * its last two dimensions are both sequence lengths of the inputs
        (the sizes of every dimension of integer and bool inputs, and of
        every dimension but the last of floating inputs), or they are equal
        to each other and to no dimension of a parameter or buffer (so
        that [B * P, 3E] with B * P == 3E is not taken for attention);
      * it has at least min_size elements;
      * its shape is not exactly the shape of an input, a parameter or a
        buffer (such a tensor is no larger than something the caller
        already holds: this keeps [B, P, E] activations out when P == E).
    One finding per allocation: the operator that allocated it (allocator
    helpers such as aten::empty_like are skipped up to the operator that
    called them), the view with the most dimensions among those seen, the
    allocation's bytes, and the module path whose forward was running.
Tested by python/tests/test_torch_find.py.
"""

import contextlib
import warnings

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile
from torch.utils._pytree import tree_flatten

from ._quiet import drop_stderr_lines

_MODULE_TAG = "dhsa.module:"
_RETURN_TAG = "dhsa.returned:"
# Operators that only allocate for the operator that called them.
_ALLOCATORS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
               "aten::new_empty_strided", "aten::resize_", "aten::empty_permuted"}


class ProductionModeWarning(UserWarning):
    """The module was not in eval() or grad mode was on when the check was
    asked for: the check ran in production conditions anyway, which may take
    other code paths than the caller's (the mistake that hid the
    [B, H, P, P] fast path of nn.MultiheadAttention)."""


def _human(n):
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "bytes" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return str(n)


class Finding:
    """One square intermediate: .op (the operator that allocated it, e.g.
    "aten::bmm"), .shape (tuple), .dtype (e.g. "torch.float32"), .nbytes
    (bytes of the allocation), .module (dotted path from the checked module,
    "" for the module itself), .module_type (its class name), .read_by (the
    first operator that read it, or "returned by MODULE")."""

    __slots__ = ("op", "shape", "dtype", "nbytes", "module", "module_type", "read_by")

    def __init__(self, op, shape, dtype, nbytes, module, module_type, read_by):
        self.op, self.shape, self.dtype, self.nbytes = op, tuple(shape), dtype, int(nbytes)
        self.module, self.module_type, self.read_by = module, module_type, read_by

    def __repr__(self):
        return "Finding(op=%r, shape=%r, dtype=%r, nbytes=%d, module=%r)" % (
            self.op, self.shape, self.dtype, self.nbytes, self.module)

    def __str__(self):
        where = "%s (%s)" % (self.module or "<root>", self.module_type)
        return "%s -> %s %s, %s, in %s, read by %s" % (
            self.op, list(self.shape), self.dtype.replace("torch.", ""), _human(self.nbytes),
            where, self.read_by)


class Findings(list):
    """A list of Finding, in the order they were allocated, with .notes
    (the production-mode warnings of the run) and .min_size."""

    def __init__(self, items=(), notes=(), min_size=0):
        super().__init__(items)
        self.notes = list(notes)
        self.min_size = min_size

    def __str__(self):
        lines = ["note: " + n for n in self.notes]
        if not self:
            lines.append("no square intermediate of at least %d elements" % self.min_size)
        else:
            total = sum(f.nbytes for f in self)
            lines.append("%d square intermediate%s of at least %d elements (%s in all):"
                         % (len(self), "" if len(self) == 1 else "s", self.min_size, _human(total)))
            lines += ["  " + str(f) for f in self]
        return "\n".join(lines)


# ------------------------------------------------------------- helpers ---


def _tensors(tree):
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _sequence_lengths(inputs):
    """Sizes that may be sequence lengths: every dimension of an integer or
    bool input, every dimension but the last (features) of a floating one."""
    s = set()
    for t in inputs:
        dims = t.shape if not t.is_floating_point() or t.dim() < 2 else t.shape[:-1]
        s.update(int(n) for n in dims if n > 1)
    return s


def _is_square(sizes, seq, min_size, known, features):
    if len(sizes) < 2:
        return False
    n, m = sizes[-2], sizes[-1]
    if not ((n in seq and m in seq) or (n == m and n not in features)):
        return False
    numel = 1
    for x in sizes:
        numel *= x
    return numel >= min_size and tuple(sizes) not in known


def _module_hooks(names):
    """Global module hooks (torch.nn.modules.module.register_module_forward_*)
    that mark the forward of each module in `names` as a profiler range and
    make what it returns visible to the profiler as an operator input
    (aten::alias, free). Per-module hooks would change what is measured:
    nn.TransformerEncoderLayer leaves its fast path when a submodule has
    one."""
    from torch.nn.modules import module as M
    stacks = {}

    def pre(m, args):
        if id(m) not in names:
            return None
        rf = record_function(_MODULE_TAG + names[id(m)])
        rf.__enter__()
        stacks.setdefault(id(m), []).append(rf)
        return None

    def post(m, args, out):
        st = stacks.get(id(m))
        if not st:
            return None
        rf = st.pop()
        try:
            with record_function(_RETURN_TAG + names[id(m)]):
                for t in _tensors(out):
                    if t.dim() >= 2 and t.layout == torch.strided:
                        torch.ops.aten.alias.default(t)
        finally:
            rf.__exit__(None, None, None)
        return None

    return [M.register_module_forward_pre_hook(pre),
            M.register_module_forward_hook(post, always_call=True)]


def _event_tree(prof):
    try:
        return prof.profiler.kineto_results.experimental_event_tree()
    except AttributeError as e:
        raise RuntimeError("find_square_intermediates: this PyTorch (%s) has no profiler event tree "
                           "(prof.profiler.kineto_results.experimental_event_tree); it needs "
                           "PyTorch 2.1 or later" % torch.__version__) from e


def _kind(node):
    return type(node.extra_fields).__name__


def _walk(roots, seq, min_size, known, features, types):
    """Two passes over the profiler's event tree: allocations (id -> op,
    module, bytes), then every operator input that passes _is_square,
    grouped by allocation."""
    allocs = {}

    def pass1(node, ops, mods):
        k = _kind(node)
        if k == "_ExtraFields_Allocation":
            ef = node.extra_fields
            if ef.alloc_size > 0 and ef.allocation_id not in allocs:
                op = next((o for o in reversed(ops) if o not in _ALLOCATORS), "(outside any operator)")
                allocs[ef.allocation_id] = (op, mods[-1] if mods else "", int(ef.alloc_size))
            return
        name = node.name
        if k == "_ExtraFields_TorchOp" and name.startswith(_MODULE_TAG):
            mods = mods + [name[len(_MODULE_TAG):]]
        elif k == "_ExtraFields_TorchOp" and not name.startswith(_RETURN_TAG):
            ops = ops + [name]
        for c in node.children:
            pass1(c, ops, mods)

    found = {}
    order = []

    def visit_input(x, reader):
        if isinstance(x, (list, tuple)):
            for y in x:
                visit_input(y, reader)
            return
        sizes = getattr(x, "sizes", None)
        aid = getattr(x, "allocation_id", None)
        if sizes is None or aid is None or aid not in allocs:
            return  # not a tensor, or allocated before the forward (an input, a weight)
        sizes = [int(n) for n in sizes]
        if not _is_square(sizes, seq, min_size, known, features):
            return
        f = found.get(aid)
        if f is None:
            op, mod, nbytes = allocs[aid]
            f = Finding(op, sizes, str(x.dtype), nbytes, mod, types.get(mod, "?"), reader)
            found[aid] = f
            order.append(aid)
        elif len(sizes) > len(f.shape):
            f.shape = tuple(sizes)

    def pass2(node):
        k = _kind(node)
        if k == "_ExtraFields_TorchOp":
            name = node.name
            if name.startswith(_RETURN_TAG):
                reader = "returned by %s" % (name[len(_RETURN_TAG):] or "<root>")
                for c in node.children:  # the aten::alias calls
                    if _kind(c) == "_ExtraFields_TorchOp":
                        for x in c.extra_fields.inputs:
                            visit_input(x, reader)
                return
            if not name.startswith(_MODULE_TAG):
                for x in node.extra_fields.inputs:
                    visit_input(x, name)
        for c in node.children:
            pass2(c)

    for r in roots:
        pass1(r, [], [])
    for r in roots:
        pass2(r)
    return [found[a] for a in order]

# ----------------------------------------------------------------- API ---


def _activities(inputs, module):
    """The profiler activities for the devices the inputs and the module's
    tensors are on: CPU always (operators are recorded there, with their
    shapes, whatever device runs them), plus CUDA (also ROCm) and XPU where
    a tensor lives there, so that the device's allocations are recorded."""
    devs = {t.device.type for t in inputs}
    devs |= {t.device.type for t in list(module.parameters()) + list(module.buffers())}
    acts = [ProfilerActivity.CPU]
    if "cuda" in devs and hasattr(ProfilerActivity, "CUDA"):
        acts.append(ProfilerActivity.CUDA)
    if "xpu" in devs and hasattr(ProfilerActivity, "XPU"):
        acts.append(ProfilerActivity.XPU)
    return acts


def find_square_intermediates(module, *args, min_size=1024, **kwargs):
    """Runs module(*args, **kwargs) once in eval() under
    torch.inference_mode() and returns a Findings list of the square
    intermediates it built (see the file's contract): each Finding has .op,
    .shape, .dtype, .nbytes, .module; str() of the list is a readable
    report. min_size: elements (not bytes) a tensor must have to count.

    A submodule in training mode or grad mode being on (outside
    inference_mode) raises a ProductionModeWarning: the check still runs in
    eval() and inference_mode, the conditions under which PyTorch takes its
    fast paths, and restores the training flags afterwards. The module's
    output is discarded."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError("find_square_intermediates checks a torch.nn.Module, not %s"
                        % type(module).__name__)
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 1:
        raise ValueError("min_size must be a positive integer (elements), not %r" % (min_size,))

    names = {}
    types = {}
    for path, m in module.named_modules(remove_duplicate=False):
        names.setdefault(id(m), path)
        types.setdefault(names[id(m)], type(m).__name__)
    notes = []
    training = [(p or "<root>") for p, m in module.named_modules() if m.training]
    if training:
        shown = ", ".join(training[:4]) + (", ..." if len(training) > 4 else "")
        notes.append("%d module%s %s in training mode (%s): checked in eval(), where PyTorch takes "
                     "its inference fast paths (a test in training mode does not see them); the "
                     "training flags are restored after the check"
                     % (len(training), "" if len(training) == 1 else "s",
                        "was" if len(training) == 1 else "were", shown))
    if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
        notes.append("grad mode was on: checked under torch.inference_mode(), where PyTorch takes "
                     "its inference fast paths (with gradients it takes another path)")
    for n in notes:
        warnings.warn(n, ProductionModeWarning, stacklevel=2)

    inputs = _tensors((args, kwargs))
    seq = _sequence_lengths(inputs)
    known = {tuple(int(n) for n in t.shape) for t in inputs}
    known |= {tuple(int(n) for n in p.shape) for p in module.parameters()}
    known |= {tuple(int(n) for n in b.shape) for b in module.buffers()}
    features = {int(n) for t in list(module.parameters()) + list(module.buffers()) for n in t.shape}

    flags = [(m, m.training) for m in module.modules()]
    handles = _module_hooks(names)
    try:
        module.eval()
        prof = profile(activities=_activities(inputs, module), record_shapes=True,
                       profile_memory=True)
        # Without a GPU the profiler's device probe logs an ERROR line on a
        # correct run: dropped (only that line) where PyTorch sees no GPU.
        quiet = drop_stderr_lines if not torch.cuda.is_available() else contextlib.nullcontext
        with torch.inference_mode():
            with quiet():
                prof.__enter__()
            try:
                module(*args, **kwargs)
            finally:
                with quiet():
                    prof.__exit__(None, None, None)
    finally:
        for h in handles:
            h.remove()
        for m, t in flags:
            m.training = t
    found = _walk(_event_tree(prof), seq, min_size, known, features, types)
    return Findings(found, notes, min_size)
