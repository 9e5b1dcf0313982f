"""Writes a trained model as GGUF (F16 or Q8_0) with its SentencePiece tokenizer,
and reads GGUF weights back (for --init and the logit cross-check).

Names and shapes are those `dhsa run` (and llama.cpp) read for arch "llama":
token_embd, blk.N.{attn_norm,attn_q,attn_k,attn_v,attn_output,ffn_norm,
ffn_gate,ffn_up,ffn_down}, output_norm, output. Norm vectors stay F32; every
matrix is F16 or Q8_0. RoPE pairs are adjacent in model.py, as GGUF llama
expects, so Q and K are written as they are.

Usage: python export.py CKPT.pt TOKENIZER.model OUT.gguf [--type f16|q8_0] [--name NAME]
The file is written to OUT.gguf.part and renamed.
"""
import argparse
import os

import numpy as np
import sentencepiece as spm
import torch
import gguf

from model import Config

MAP = [("tok_embd.weight", "token_embd.weight"), ("norm.weight", "output_norm.weight"),
       ("output.weight", "output.weight")]
LAYER = [("attn_norm.weight", "attn_norm.weight"), ("wq.weight", "attn_q.weight"), ("wk.weight", "attn_k.weight"),
         ("wv.weight", "attn_v.weight"), ("wo.weight", "attn_output.weight"), ("ffn_norm.weight", "ffn_norm.weight"),
         ("w_gate.weight", "ffn_gate.weight"), ("w_up.weight", "ffn_up.weight"), ("w_down.weight", "ffn_down.weight")]


def names(cfg):
    out = list(MAP)
    for i in range(cfg.n_layer):
        out += [(f"layers.{i}.{a}", f"blk.{i}.{b}") for a, b in LAYER]
    return out


def write(state, cfg, tok_path, out, qtype="f16", name="dhsa-retrieval", extra=None):
    sp = spm.SentencePieceProcessor(model_file=tok_path)
    tmp = out + ".part"
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name(name)
    w.add_context_length(cfg.ctx)
    w.add_embedding_length(cfg.dim)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.ffn)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_kv_head)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_layer_norm_rms_eps(cfg.eps)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if qtype == "f16" else gguf.LlamaFileType.MOSTLY_Q8_0)
    for k, v in (extra or {}).items():
        w.add_string(k, v)
    w.add_tokenizer_model("llama")
    toks, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        toks.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        types.append(gguf.TokenType.UNKNOWN if sp.is_unknown(i) else gguf.TokenType.CONTROL if sp.is_control(i)
                     else gguf.TokenType.BYTE if sp.is_byte(i) else gguf.TokenType.UNUSED if sp.is_unused(i)
                     else gguf.TokenType.NORMAL)
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    for tn, gn in names(cfg):
        a = state[tn].detach().float().numpy()
        if a.ndim == 1:
            w.add_tensor(gn, a.astype(np.float32))
        elif qtype == "f16":
            w.add_tensor(gn, a.astype(np.float16))
        else:
            q = gguf.quants.quantize(a.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gn, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)


def read_config(path):
    r = gguf.GGUFReader(path)
    f = lambda k: r.fields[k].parts[r.fields[k].data[0]][0].item()
    tok = r.fields["tokenizer.ggml.tokens"]
    return Config(vocab=len(tok.data), dim=f("llama.embedding_length"), n_layer=f("llama.block_count"),
                  n_head=f("llama.attention.head_count"), n_kv_head=f("llama.attention.head_count_kv"),
                  head_dim=f("llama.rope.dimension_count"), ffn=f("llama.feed_forward_length"),
                  rope_base=f("llama.rope.freq_base"), eps=f("llama.attention.layer_norm_rms_epsilon"),
                  ctx=f("llama.context_length"))


def load_gguf_weights(path, cfg):
    """state_dict for model.Model from a GGUF file (F32, F16 or Q8_0 tensors, dequantized)."""
    r = gguf.GGUFReader(path)
    by = {t.name: t for t in r.tensors}
    st = {}
    for tn, gn in names(cfg):
        t = by[gn]
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape)]
        st[tn] = torch.from_numpy(a.reshape(shape).copy())
    return st


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--type", default="f16", choices=["f16", "q8_0"])
    ap.add_argument("--name", default="dhsa-retrieval-8m")
    a = ap.parse_args()
    ck = torch.load(a.ckpt, weights_only=False, map_location="cpu")
    cfg = Config(**ck["cfg"])
    write(ck["model"], cfg, a.tokenizer, a.out, a.type, a.name,
          {"dhsa.train.step": str(ck["step"])})
    print(f"wrote {a.out} ({a.type}, step {ck['step']}, {os.path.getsize(a.out) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
