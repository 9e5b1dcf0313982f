"""Attention supervision for the keyword match (docs/training.md, "The fifth run").

The shipped step-4200 model tells multikey keywords apart mostly by their
number of pieces: at the row that predicts the asked number's first digit,
no head of layers 0-1 attends to the question's keyword (they attend to
`for`, `the`, `xt`, `is`: fixed anchors, whose distance gives the length),
and the layer-2 heads that read the needles' first digits spread their
attention nearly evenly over all of them (0.27 on the right one against
0.24 on each wrong one, 40 held-out prompts; /work/scratch analysis in
docs/training.md). The content match is a two-hop circuit: a head gathers
the keyword's pieces at the answer row and at each needle's first digit,
then a later head matches the two and copies the digit. Neither hop gets a
direct gradient from the answer loss until the other exists, and 1 M tokens
of fine-tuning on equal-length keywords did not start it. So two auxiliary
losses supervise the attention of chosen heads, at the rows where the match
happens, in training only (the exported model is a plain Llama; nothing
here exists at inference):

- the gather hop (`--gather-sup LAYER:HEADS`): at the answer's first-digit
  row and at every needle's first digit, -log of the attention mass on the
  pieces of the keyword that row reads (the question's latest mention, the
  needle's keyword);
- the match hop (`--att-sup LAYER:HEADS`): at the answer's first-digit row,
  -log of the attention mass on the first digit of the same number in the
  needles.

Each is the mean over rows and heads; a block's queries and keys are
recomputed from its input exactly as model.Block.forward computes them.
"""
import math

import torch

from model import apply_rope, rope_tables


class Anchors:
    """Piece ids of the magic-number templates (tasks.magic_needle,
    multikey_q, multivalue_q) for one tokenizer."""

    def __init__(self, sp):
        self.space = sp.piece_to_id("\u2581")
        self.digits = {sp.piece_to_id(str(d)) for d in range(10)}
        self.colon = sp.piece_to_id(":")
        self.for_ = sp.piece_to_id("\u2581for")
        self.number = {sp.piece_to_id("\u2581number"), sp.piece_to_id("ers")}  # "number for", "numbers for"
        self.mention = sp.piece_to_id("\u2581m")  # "▁m ention ed" after the keyword of a question
        for name, v in (("colon", self.colon), ("for", self.for_), ("mention", self.mention)):
            if v == sp.unk_id():
                raise ValueError(f"tokenizer has no piece for the template's {name}")


def keyword_span(an, ids, pos, needle=False):
    """Positions of the keyword's pieces that pos reads: the needle's
    (`numbers for KW is: ▁N`, pos at N's first digit) or the question's latest
    (`number for KW mentioned ... is ▁`, pos at the final `▁`); [] if absent."""
    f = pos - 1
    while f > 0 and not (ids[f] == an.for_ and ids[f - 1] in an.number):
        f -= 1
    if f <= 0:
        return []
    if needle:
        return list(range(f + 1, pos - 3)) if pos - 3 > f + 1 else []
    e = f + 1
    while e < pos and ids[e] != an.mention:
        e += 1
    return list(range(f + 1, e)) if e < pos else []


def targets_for(an, ids, first_rows):
    """For each row r in first_rows (r predicts the first digit ids[r + 1] of
    an answer number): (r, needle first-digit positions of the same number,
    the question keyword's pieces, each needle keyword's pieces). Rows whose
    number is in no magic-number needle (passkeys) are left out."""
    out = []
    for r in first_rows:
        j = r + 1
        k = j
        while k < len(ids) and ids[k] in an.digits:
            k += 1
        num = ids[j:k]
        tps = [p for p in range(2, r) if ids[p - 2] == an.colon and ids[p - 1] == an.space
               and ids[p:p + len(num)] == num and (p + len(num) >= len(ids) or ids[p + len(num)] not in an.digits)]
        if tps:
            out.append((r, tps, keyword_span(an, ids, r), [keyword_span(an, ids, p, True) for p in tps]))
    return out


def _qk(blk, x_in):
    cfg = blk.cfg
    h = blk.attn_norm(x_in)
    B, T, _ = h.shape
    cos, sin = rope_tables(cfg, T)
    q = apply_rope(blk.wq(h).view(B, T, cfg.n_head, cfg.head_dim).transpose(1, 2), cos, sin)
    k = apply_rope(blk.wk(h).view(B, T, cfg.n_kv_head, cfg.head_dim).transpose(1, 2), cos, sin)
    return q.float(), k.float(), cfg.n_head // cfg.n_kv_head, math.sqrt(cfg.head_dim)


def _nll_mass(q, k, g, scale, i, r, heads, tgt):
    """-log of the softmax mass on positions tgt at query row r, per head."""
    return [torch.logsumexp(s, 0) - torch.logsumexp(s[tgt], 0)
            for s in ((k[i, hd // g, :r + 1] @ q[i, hd, r]) / scale for hd in heads)]


def match_loss(blk, x_in, targets, heads):
    """targets: [(sequence, row, tps, kw_row, kw_tps)]: the answer row's
    attention pulled to the needle's first digit."""
    q, k, g, scale = _qk(blk, x_in)
    ls = [v for i, r, tps, _, _ in targets for v in _nll_mass(q, k, g, scale, i, r, heads, tps)]
    return torch.stack(ls).mean() if ls else x_in.sum() * 0


def gather_loss(blk, x_in, targets, heads):
    """The answer row's and each needle digit's attention pulled to the pieces
    of the keyword each reads."""
    q, k, g, scale = _qk(blk, x_in)
    ls = []
    for i, r, tps, kw_r, kw_tps in targets:
        for row, kw in [(r, kw_r)] + list(zip(tps, kw_tps)):
            if kw:
                ls += _nll_mass(q, k, g, scale, i, row, heads, kw)
    return torch.stack(ls).mean() if ls else x_in.sum() * 0


def parse_heads(spec):
    """"LAYER:H1,H2" -> (layer, [heads]); "" -> None."""
    if not spec:
        return None
    lay, hs = spec.split(":")
    return int(lay), [int(v) for v in hs.split(",")]


class Supervisor:
    """Captures the inputs of the supervised blocks during a training forward
    and returns the two losses for a batch's targets."""

    def __init__(self, model, gather_spec, match_spec):
        self.gather, self.match = parse_heads(gather_spec), parse_heads(match_spec)
        self.inputs = {}
        for spec in (self.gather, self.match):
            if spec:
                blk = model.layers[spec[0]]
                blk.register_forward_pre_hook(
                    lambda mod, args, l=spec[0]: self.inputs.__setitem__(l, args[0]) if mod.training else None)
        self.model = model

    def active(self):
        return bool(self.gather or self.match)

    def losses(self, targets):
        """(gather, match) for the last forward; zero tensors for an unset hop."""
        z = torch.zeros(())
        lg = gather_loss(self.model.layers[self.gather[0]], self.inputs[self.gather[0]], targets,
                         self.gather[1]) if self.gather else z
        lm = match_loss(self.model.layers[self.match[0]], self.inputs[self.match[0]], targets,
                        self.match[1]) if self.match else z
        self.inputs.clear()
        return lg, lm
