"""_context.py: dhsa_ctx as a Python object, the lazily created module-level
default context, and process memory readers (peak RSS).

Which context a call uses (see resolve()): ctx= if given; else threads= (one
cached context per thread count); else the innermost `with Context(...)`
block of the current thread / asyncio task; else the default context (all
online CPUs, no budget), created on first use and freed at exit.

A context serialises its own calls with a lock: the C thread pool is not
reentrant, and ctypes releases the GIL during the call, so two Python threads
sharing a context would otherwise race.

Objects allocated from a context (dhsa.Layout, dhsa.KVIndex: _route.py)
free themselves through it, so they keep it alive, and closing the context
closes them first (the C library cannot free them once the context is gone).
Lock order: a context's lock before any of its objects' locks.
"""

import contextvars
import ctypes
import threading
import weakref

from . import _capi
from ._capi import check, lib

_INT_MAX = 2**31 - 1
_SIZE_MAX = 2**64 - 1


def _free_handle(handle):
    lib().dhsa_ctx_free(handle)


class Context:
    """A dhsa context: a thread pool, a tracked memory arena with statistics,
    and an optional memory budget.

    Context(threads=None, mem_budget=None): threads None or 0 = all online
    CPUs; mem_budget None or 0 = unlimited, else the bytes the context may
    hold at once (a call that would exceed it raises DhsaError
    DHSA_ERR_MEMORY_BUDGET before doing any work).

    Use it as ctx= argument, or as a context manager:

        with dhsa.Context(threads=4, mem_budget=64 << 20) as c:
            dhsa.attention(q, k, v)      # runs on c
        # c is closed here (threads joined, arena freed)
    """

    def __init__(self, threads=None, mem_budget=None):
        n = 0 if threads is None else int(threads)
        if not 0 <= n <= _INT_MAX:
            raise ValueError("threads = %d: use None or 0 (all online CPUs) or a positive count" % n)
        budget = 0 if mem_budget is None else int(mem_budget)
        if not 0 <= budget <= _SIZE_MAX:
            raise ValueError("mem_budget = %d bytes: use None or 0 (unlimited) or a positive size"
                             % budget)
        params = _capi.CtxParams(n_threads=n, mem_budget=budget)
        handle = ctypes.c_void_p()
        check(lib().dhsa_ctx_create(ctypes.byref(params), ctypes.byref(handle)))
        self._handle = handle.value
        self._lock = threading.Lock()
        self._tokens = []
        # objects allocated from this context: key -> (their lock, their
        # finalizer). Reentrant: a finalizer run by the garbage collector
        # (which calls _disown) may interrupt this thread while it holds it.
        self._deps = {}
        self._deps_lock = threading.RLock()
        self._finalizer = weakref.finalize(self, _free_handle, self._handle)

    # -- lifecycle --

    @property
    def closed(self):
        return self._handle is None

    def close(self):
        """Frees the context (joins its threads, frees its arena), after
        closing the layouts and decode indexes allocated from it. Idempotent."""
        with self._lock:
            if self._handle is not None:
                with self._deps_lock:
                    deps, self._deps = self._deps, {}
                for lock, fin in deps.values():
                    with lock:
                        fin()
                self._handle = None
                self._finalizer()

    # -- objects allocated from the context (see the module comment) --

    def _adopt(self, key, lock, finalizer):
        with self._deps_lock:
            self._deps[key] = (lock, finalizer)

    def _disown(self, key):
        with self._deps_lock:
            self._deps.pop(key, None)

    def __enter__(self):
        if self._handle is None:
            raise ValueError("this dhsa.Context is closed")
        self._tokens.append(_current.set(self))
        return self

    def __exit__(self, *exc):
        _current.reset(self._tokens.pop())
        self.close()
        return False

    def __repr__(self):
        if self._handle is None:
            return "<dhsa.Context closed>"
        s = self.mem_stats()
        return "<dhsa.Context threads=%d budget=%s in_use=%d peak=%d>" % (
            self.n_threads, s["budget"] or "unlimited", s["in_use"], s["peak"])

    # -- use by the API --

    def _live_handle(self):
        """The C handle; call with self._lock held (it is None once closed)."""
        if self._handle is None:
            raise ValueError("this dhsa.Context is closed")
        return self._handle

    # -- statistics and budget --

    @property
    def n_threads(self):
        with self._lock:
            return int(lib().dhsa_ctx_n_threads(self._live_handle()))

    def mem_stats(self):
        """dhsa_mem_stats as a dict: in_use, peak, largest, n_allocs, budget
        (bytes; budget 0 = unlimited)."""
        with self._lock:
            s = lib().dhsa_ctx_mem_stats(self._live_handle())
        return {"in_use": int(s.in_use), "peak": int(s.peak), "largest": int(s.largest),
                "n_allocs": int(s.n_allocs), "budget": int(s.budget)}

    def reset_peak(self):
        """Sets peak = in_use."""
        with self._lock:
            lib().dhsa_ctx_reset_peak(self._live_handle())

    def set_budget(self, nbytes):
        """0 or None = unlimited. Raises DhsaError (DHSA_ERR_MEMORY_BUDGET) if
        the context already holds more than nbytes."""
        b = 0 if nbytes is None else int(nbytes)
        if not 0 <= b <= _SIZE_MAX:
            raise ValueError("budget = %d bytes is negative or too large" % b)
        with self._lock:
            check(lib().dhsa_ctx_set_budget(self._live_handle(), b))

    def trim(self):
        """Gives the kernels' scratch arena back (it is kept between calls)."""
        with self._lock:
            lib().dhsa_ctx_trim(self._live_handle())


# ------------------------------------------------------------ resolution ---

_current = contextvars.ContextVar("dhsa_current_context", default=None)
_default = None
_by_threads = {}
_default_lock = threading.Lock()


def default_context():
    """The module-level context (all online CPUs, no budget), created on
    first use."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Context()
    return _default


def _context_for_threads(n):
    n = int(n)
    if n == 0:
        return default_context()
    with _default_lock:
        c = _by_threads.get(n)
        if c is None:
            c = _by_threads[n] = Context(threads=n)
        return c


def resolve(ctx=None, threads=None):
    """The Context a call runs on (see the module comment)."""
    if ctx is not None:
        if not isinstance(ctx, Context):
            raise TypeError("ctx must be a dhsa.Context, not %s" % type(ctx).__name__)
        if threads is not None and int(threads) != ctx.n_threads:
            raise ValueError("threads=%s disagrees with ctx, which has %d threads"
                             % (threads, ctx.n_threads))
        return ctx
    if threads is not None:
        return _context_for_threads(threads)
    cur = _current.get()
    if cur is not None and not cur.closed:
        return cur
    return default_context()


def mem_stats(ctx=None):
    """Statistics (dict) of ctx, or of the context a call would use now."""
    return resolve(ctx).mem_stats()

# ---------------------------------------------------------- process memory ---


def peak_rss():
    """Peak resident set of this process in bytes: max(VmHWM, VmRSS) on
    Linux, 0 where unknown."""
    return int(lib().dhsa_proc_peak_rss())


def rss():
    """Current resident set (VmRSS) in bytes, 0 where unknown."""
    return int(lib().dhsa_proc_rss())


def reset_peak_rss():
    """Resets the peak (VmHWM) to the current RSS through
    /proc/self/clear_refs. Raises DhsaError (DHSA_ERR_UNSUPPORTED) where that
    is not possible."""
    check(lib().dhsa_proc_reset_peak_rss())


def active_isa():
    """Name of the instruction set the kernels use ("avx512", "avx2",
    "scalar")."""
    L = lib()
    return L.dhsa_isa_name(L.dhsa_active_isa()).decode("ascii")


def set_isa(name):
    """Overrides the kernels' instruction set for this process ("scalar",
    "avx2", "avx512"). Raises DhsaError (DHSA_ERR_UNSUPPORTED) if the CPU or
    build lacks it. Not safe while attention runs on another thread."""
    if name not in _capi.ISAS:
        raise ValueError("isa must be one of %s, not %r" % (sorted(_capi.ISAS), name))
    check(lib().dhsa_set_isa(_capi.ISAS[name]))
