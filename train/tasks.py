"""The retrieval tasks, in exactly the formats the evaluation uses.

passkey:    PASSKEY_PRE + filler + " The pass key is N. Remember it. N is the pass key. "
            + filler + " What is the pass key? The pass key is"        -> " N" (5 digits)
multikey:   MAGIC_PRE + filler with several "One of the special magic numbers for KW is: N."
            sentences (distinct keywords) + " What is the special magic number for KW mentioned
            in the provided text? The special magic number for KW mentioned in the provided
            text is"                                                   -> " N" (7 digits)
multivalue: the same sentences, several for one keyword (and other keywords as
            distractors) + " What are all the special magic numbers for KW mentioned in
            the provided text? The special magic numbers for KW mentioned in the provided
            text are"                                                  -> " N1, N2, N3" in
            the order they appear
The C evaluation (src/eval, `dhsa eval passkey|multikey|multivalue`) builds the same strings.
"""
import bisect

from corpus import is_heldout_key

PASSKEY_PRE = ("There is an important info hidden inside a lot of irrelevant text. "
               "Find it and memorize it. I will quiz you about the important information there. ")
MAGIC_PRE = ("Some special magic numbers are hidden within the following text. "
             "Make sure to memorize it. I will quiz you about the numbers afterwards. ")


def passkey_needle(k):
    return f"The pass key is {k}. Remember it. {k} is the pass key."


PASSKEY_Q = " What is the pass key? The pass key is"


def magic_needle(kw, n):
    return f"One of the special magic numbers for {kw} is: {n}."


def multikey_q(kw):
    return (f" What is the special magic number for {kw} mentioned in the provided text?"
            f" The special magic number for {kw} mentioned in the provided text is")


def multivalue_q(kw):
    return (f" What are all the special magic numbers for {kw} mentioned in the provided text?"
            f" The special magic numbers for {kw} mentioned in the provided text are")


class Source:
    """A filler text with its space positions, and the keys allowed with it."""

    def __init__(self, text, keywords, heldout):
        self.text = text
        self.spaces = [i for i, c in enumerate(text) if c == " "]
        self.keywords = keywords
        self.heldout = heldout  # held-out keys (evaluation) or training keys

    def number(self, rng, digits):
        lo = 10 ** (digits - 1)
        while True:
            n = rng.randrange(lo, 10 * lo)
            if is_heldout_key(str(n), 10) == self.heldout:
                return n

    def span(self, rng, nchars):
        """nchars of text starting and ending at a word boundary."""
        nchars = max(1, min(nchars, len(self.text) - 2))
        a = rng.randrange(0, len(self.text) - nchars)
        i = bisect.bisect_left(self.spaces, a)
        a = self.spaces[i] + 1 if i < len(self.spaces) else 0
        b = min(len(self.text), a + nchars)
        j = bisect.bisect_left(self.spaces, b)
        b = self.spaces[j] if j < len(self.spaces) else len(self.text)
        return self.text[a:b].strip()


def _insert(filler, items, positions):
    """Puts each item (a sentence) at a word boundary near positions[i] (fractions 0..1)."""
    cuts = []
    for p in positions:
        c = int(p * len(filler))
        sp = filler.find(" ", c)
        cuts.append(len(filler) if sp < 0 else sp)
    order = sorted(range(len(items)), key=lambda i: (cuts[i], i))
    out, last = [], 0
    for i in order:
        out.append(filler[last:cuts[i]])
        out.append(" " + items[i] + " ")
        last = cuts[i]
    out.append(filler[last:])
    s = "".join(out)
    return " ".join(s.split()), order


def passkey(src, rng, nchars, depth=None):
    k = src.number(rng, 5)
    f = src.span(rng, nchars)
    d = rng.random() if depth is None else depth
    body, _ = _insert(f, [passkey_needle(k)], [d])
    return PASSKEY_PRE + body + PASSKEY_Q, f" {k}"


def multikey(src, rng, nchars, n_keys=None, depth=None):
    n_keys = n_keys or rng.randint(2, 6)
    kws = rng.sample(src.keywords, n_keys)
    nums = [src.number(rng, 7) for _ in kws]
    pos = [rng.random() for _ in kws]
    t = rng.randrange(n_keys)
    if depth is not None:
        pos[t] = depth
    body, _ = _insert(src.span(rng, nchars), [magic_needle(k, n) for k, n in zip(kws, nums)], pos)
    return MAGIC_PRE + body + multikey_q(kws[t]), f" {nums[t]}"


def multivalue(src, rng, nchars, n_values=None, n_distract=None):
    n_values = n_values or rng.randint(2, 4)
    n_distract = rng.randint(0, 3) if n_distract is None else n_distract
    kws = rng.sample(src.keywords, 1 + n_distract)
    items, pos, vals = [], [], []
    for i in range(n_values):
        v = src.number(rng, 7)
        items.append(magic_needle(kws[0], v)); pos.append(rng.random()); vals.append(v)
    for kw in kws[1:]:
        items.append(magic_needle(kw, src.number(rng, 7))); pos.append(rng.random())
    body, order = _insert(src.span(rng, nchars), items, pos)
    ans = [vals[i] for i in order if i < n_values]
    return MAGIC_PRE + body + multivalue_q(kws[0]), " " + ", ".join(str(v) for v in ans)


def repeat(src, rng, nchars):
    """Plain text in which one passage occurs twice: every token of the copy but
    its first is predictable from context (the induction signal, dense). Half
    of the passages are lists of random words put early in the text (nothing
    predicts their copy but the first occurrence), half a span of the text.
    Returns (text, (start, end)): the copy's character range in text."""
    f = src.span(rng, nchars)
    n = min(len(f) // 3, rng.randint(100, 600))
    if n < 20:
        return f, None
    if rng.random() < 0.5:
        # a list of random words: unpredictable but by copying, placed early
        words = []
        while sum(len(w) + 1 for w in words) < n:
            words.append(rng.choice(src.keywords))
        seg = " ".join(words)
        q = f.find(" ", int(rng.uniform(0.0, 0.4) * len(f)))
        if q > 0:
            f = f[:q] + " " + seg + f[q:]
    else:
        a = rng.randrange(0, len(f) // 2 - n // 2)
        seg = f[a:a + n]
        seg = seg[seg.find(" ") + 1:].strip()
    p = f.find(" ", int(rng.uniform(0.5, 1.0) * len(f)))
    if p < 0 or not seg:
        return f, None
    text = f[:p] + " " + seg + f[p:]
    return text, (p + 1, p + 1 + len(seg))


def copy_list(src, rng, nchars):
    """Text with one list of random words (training keywords) repeated 2-4 times
    at random places: the purest in-context copy signal. Returns (text, ranges):
    the character ranges of every repetition after the first."""
    f = src.span(rng, nchars)
    words = [rng.choice(src.keywords) for _ in range(rng.randint(max(3, nchars // 60), max(4, nchars // 25)))]
    seg = " ".join(words)
    k = rng.randint(2, 4)
    pos = sorted(rng.random() for _ in range(k))
    out, last, ranges = [], 0, []
    n = 0
    for i, p in enumerate(pos):
        c = f.find(" ", int(p * len(f)))
        c = len(f) if c < 0 else max(c, last)
        piece = f[last:c]
        out.append(piece)
        n += len(piece)
        out.append(" ")
        n += 1
        if i > 0:
            ranges.append((n, n + len(seg)))
        out.append(seg)
        n += len(seg)
        last = c
    out.append(f[last:])
    return "".join(out), ranges


def multiquery(src, rng, nchars, n_keys=None, n_multi=None, early=None):
    """Associative recall in the multikey format, many answers per sequence:
    n_keys keywords (some with 2-3 numbers) hidden in the filler, then one
    question per keyword in random order, each followed by its answer: the
    multikey question + " N." for a keyword with one number, the multivalue
    question + " N1, N2." for one with several. Returns (text, [(start, end)]):
    the character ranges of every answer (the digits, commas and spaces after
    " is"/" are", before the full stop). early: the first needle's position
    (a fraction of the filler) instead of a random one. Every question is exactly what the
    evaluation asks; only the number of questions per text differs."""
    n_keys = n_keys or rng.randint(2, 8)
    n_multi = rng.randint(0, min(2, n_keys - 1)) if n_multi is None else n_multi
    kws = rng.sample(src.keywords, n_keys)
    items, pos, owner = [], [], []
    for i, kw in enumerate(kws):
        for _ in range(rng.randint(2, 3) if i < n_multi else 1):
            n = src.number(rng, 7)
            items.append((kw, n)); pos.append(rng.random()); owner.append(i)
    if early is not None:
        pos[0] = early  # the first keyword's (first) needle near the start
    body, order = _insert(src.span(rng, nchars), [magic_needle(k, n) for k, n in items], pos)
    text = MAGIC_PRE + body
    ranges = []
    for i in rng.sample(range(n_keys), n_keys):
        vals = [items[j][1] for j in order if owner[j] == i]
        text += (multivalue_q(kws[i]) if i < n_multi else multikey_q(kws[i]))
        a = len(text)
        text += " " + ", ".join(str(v) for v in vals)
        ranges.append((a, len(text)))
        text += "."
    return text, ranges
