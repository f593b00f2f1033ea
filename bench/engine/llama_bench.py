#!/usr/bin/env python3
"""llama.cpp side of the engine benchmark (run by bench/engine/run.sh, not by CI).

Through llama-cpp-python's low-level API, on the same GGUF and thread count as the samewise
engine: prompt tokens/s scoring 512-token sequences (logits at every position, as scoring
needs) at batch 1 and 8 (8 sequences in one llama_decode call, one sequence id each), and
generated tokens/s (greedy, one token per decode, after a 16-token prompt). Token ids are
pseudo-random, from the same generator the engine's bench uses. Prints one JSON object with
every repeat's numbers.
"""

import argparse
import ctypes
import json
import sys
import time

import llama_cpp as L
import numpy as np


def lcg_tokens(state, n, vocab):
    out = []
    for _ in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append((state >> 33) % vocab)
    return state, out


def make_ctx(model, threads, n_ctx, n_batch, n_seq):
    p = L.llama_context_default_params()
    p.n_ctx = n_ctx
    p.n_batch = n_batch
    p.n_ubatch = 512
    p.n_seq_max = n_seq
    p.n_threads = threads
    p.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, p)
    if not ctx:
        raise SystemExit("llama_init_from_model failed")
    return ctx


def fill(batch, seqs, all_logits):
    i = 0
    for s, toks in enumerate(seqs):
        for pos, t in enumerate(toks):
            batch.token[i] = t
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = s
            batch.logits[i] = 1 if all_logits or pos == len(toks) - 1 else 0
            i += 1
    batch.n_tokens = i


def score(model, threads, seqs):
    total = sum(len(s) for s in seqs)
    ctx = make_ctx(model, threads, n_ctx=max(1024, 1024 * len(seqs)), n_batch=total, n_seq=len(seqs))
    batch = L.llama_batch_init(total, 0, len(seqs))
    fill(batch, seqs, all_logits=True)
    t = time.perf_counter()
    rc = L.llama_decode(ctx, batch)
    dt = time.perf_counter() - t
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    if rc != 0:
        raise SystemExit(f"llama_decode returned {rc}")
    return total / dt


def generate(model, threads, prompt, n_gen, vocab):
    ctx = make_ctx(model, threads, n_ctx=1024, n_batch=512, n_seq=1)
    batch = L.llama_batch_init(512, 0, 1)
    fill(batch, [prompt], all_logits=False)
    t = time.perf_counter()
    if L.llama_decode(ctx, batch) != 0:
        raise SystemExit("prompt decode failed")
    pos = len(prompt)
    for _ in range(n_gen):
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(vocab,))
        tok = int(np.argmax(logits))
        fill(batch, [[tok]], all_logits=True)
        batch.pos[0] = pos
        pos += 1
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("decode failed")
    dt = time.perf_counter() - t
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    return n_gen / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    L.llama_backend_init()
    # keep a reference: ctypes callbacks must outlive their use
    global _LOG_CB
    _LOG_CB = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(_LOG_CB, ctypes.c_void_p(0))
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        raise SystemExit(f"cannot load {a.model}")
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    out = {"llama_cpp_python": L.__version__, "threads": a.threads, "len": a.len, "score": {}, "generate": []}
    for b in [int(x) for x in a.batches.split(",") if x]:
        out["score"][str(b)] = []
        for _ in range(a.repeats):
            state, seqs = 12345, []
            for _ in range(b):
                state, s = lcg_tokens(state, a.len, vocab)
                seqs.append(s)
            out["score"][str(b)].append(score(model, a.threads, seqs))
    for _ in range(a.repeats):
        _, prompt = lcg_tokens(999, 16, vocab)
        out["generate"].append(generate(model, a.threads, prompt, a.gen, vocab))
    L.llama_model_free(model)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
