#!/usr/bin/env python3
"""Derive a Hugging Face model directory from the test GGUF, for the engine's safetensors path.

The samewise reference engine loads both GGUF files and HF directories (config.json +
safetensors); its tests check that both forms of the same weights give the same logprobs.
This script writes such a directory from the test GGUF:

  config.json              a LlamaConfig built from the GGUF metadata
  model.safetensors        every tensor dequantized to F32 (so the values equal the GGUF's
                           dequantized values exactly), with HF names, and the llama Q/K
                           permutation of the GGUF converter undone (GGUF stores Q/K rows
                           interleaved for ggml's RoPE; HF uses rotate-half)
  tokenizer.json           the committed tokenizer reference (reference-engine/tests/fixtures)
  tokenizer_config.json    bos/eos/pad tokens and the GGUF's chat template

Weights are never committed. Output directory: $SAMEWISE_HF_FIXTURE, else
~/.cache/samewise/models/smollm2-hf. Idempotent: a directory already derived from the same
GGUF (same sha256, recorded in samewise-source.json) is left alone.

  python3 -m venv .venv-fixtures
  .venv-fixtures/bin/pip install -r scripts/requirements-fixtures.txt
  .venv-fixtures/bin/python scripts/make-hf-fixture.py [--model PATH] [--out DIR]
"""

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKENIZER_JSON = ROOT / "reference-engine" / "tests" / "fixtures" / "smollm2" / "tokenizer.json"
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def default_model() -> pathlib.Path:
    env = os.environ.get("SAMEWISE_MODEL")
    if env:
        return pathlib.Path(env)
    base = os.environ.get("SAMEWISE_MODEL_DIR", str(pathlib.Path.home() / ".cache/samewise/models"))
    return pathlib.Path(base) / MODEL_NAME


def default_out() -> pathlib.Path:
    env = os.environ.get("SAMEWISE_HF_FIXTURE")
    if env:
        return pathlib.Path(env)
    return pathlib.Path.home() / ".cache/samewise/models/smollm2-hf"


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def field(reader: GGUFReader, key: str):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf's llama `permute` (rows grouped per head, halves interleaved)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def hf_name(name: str) -> str:
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise SystemExit(f"make-hf-fixture: no HF name for GGUF tensor {name!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=pathlib.Path, default=default_model())
    ap.add_argument("--out", type=pathlib.Path, default=default_out())
    args = ap.parse_args()
    if not args.model.is_file():
        print(f"make-hf-fixture: model not found: {args.model} (run scripts/fetch-model.sh)", file=sys.stderr)
        return 1
    source_sha = sha256(args.model)
    marker = args.out / "samewise-source.json"
    if marker.is_file() and json.loads(marker.read_text()).get("gguf_sha256") == source_sha:
        print(args.out)
        return 0

    reader = GGUFReader(str(args.model))
    arch = field(reader, "general.architecture")
    if arch != "llama":
        print(f"make-hf-fixture: only llama GGUFs are supported, got {arch!r}", file=sys.stderr)
        return 1
    n_head = int(field(reader, "llama.attention.head_count"))
    n_kv = int(field(reader, "llama.attention.head_count_kv") or n_head)
    hidden = int(field(reader, "llama.embedding_length"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    bos = int(field(reader, "tokenizer.ggml.bos_token_id"))
    eos = int(field(reader, "tokenizer.ggml.eos_token_id"))
    pad = field(reader, "tokenizer.ggml.padding_token_id")

    tensors = {}
    for t in reader.tensors:
        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type).astype(np.float32, copy=False))
        w = w.reshape([int(d) for d in reversed(t.shape)]) if w.ndim != len(t.shape) else w
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, n_head)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, n_kv)
        tensors[hf_name(t.name)] = np.ascontiguousarray(w)
    tied = "lm_head.weight" not in tensors

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": hidden // n_head,
        "hidden_act": "silu",
        "rms_norm_eps": float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, "llama.rope.freq_base") or 10000.0),
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "vocab_size": len(tokens),
        "tie_word_embeddings": tied,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": None if pad is None else int(pad),
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    tok_config = {
        "bos_token": tokens[bos],
        "eos_token": tokens[eos],
        "pad_token": None if pad is None else tokens[int(pad)],
        "unk_token": tokens[int(field(reader, "tokenizer.ggml.unknown_token_id") or 0)],
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token")),
        "chat_template": field(reader, "tokenizer.chat_template"),
        "model_max_length": config["max_position_embeddings"],
        "tokenizer_class": "PreTrainedTokenizerFast",
    }

    tmp = args.out.with_name(args.out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    shutil.copyfile(TOKENIZER_JSON, tmp / "tokenizer.json")
    (tmp / "samewise-source.json").write_text(json.dumps({"gguf": args.model.name, "gguf_sha256": source_sha}) + "\n")
    shutil.rmtree(args.out, ignore_errors=True)
    tmp.rename(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
