#!/usr/bin/env python3
"""Golden logprobs and the tokenizer reference for the samewise reference engine.

Hugging Face `transformers` is the independent implementation the engine is checked against:
it loads the same GGUF (dequantized to float32 by `gguf_file=`), scores the texts in
scripts/golden/texts/, and this script writes

  reference-engine/tests/fixtures/golden_smollm2.json   per text: token ids and, per position,
      the logprob of the actual token and the top-20 (id, logprob); entry 0 is null (vLLM's
      alignment: entry i is the logprob of token i given the tokens before it)
  reference-engine/tests/fixtures/smollm2/tokenizer.json, tokenizer_config.json
      the tokenizer transformers derives from the GGUF metadata (the tokenizer reference)
(scripts/golden/chat_cases.py writes the chat-template fixture with the same venv.)

CI does not run this; its outputs are committed. To regenerate (≈3 GB of wheels, CPU only):

  python3 -m venv .venv-golden
  .venv-golden/bin/pip install -r scripts/golden/requirements.txt
  scripts/fetch-model.sh
  .venv-golden/bin/python scripts/golden/generate.py [--model PATH]

Logprobs are computed as log_softmax in float64 over the float32 logits.
"""

import argparse
import hashlib
import json
import os
import pathlib
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEXTS = ROOT / "scripts" / "golden" / "texts"
FIXTURES = ROOT / "reference-engine" / "tests" / "fixtures"
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOP_K = 20


def default_model() -> pathlib.Path:
    env = os.environ.get("SAMEWISE_MODEL")
    if env:
        return pathlib.Path(env)
    base = os.environ.get("SAMEWISE_MODEL_DIR", str(pathlib.Path.home() / ".cache/samewise/models"))
    return pathlib.Path(base) / MODEL_NAME


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_texts(tok):
    """Return [(name, kind, text)] in file order; chat files are rendered with the template."""
    out = []
    for path in sorted(TEXTS.iterdir()):
        if path.suffix == ".json":
            spec = json.loads(path.read_text(encoding="utf-8"))
            text = tok.apply_chat_template(
                spec["messages"], tokenize=False, add_generation_prompt=spec["add_generation_prompt"]
            )
            out.append((path.stem, "chat", text))
        elif path.suffix == ".txt":
            out.append((path.stem, "text", path.read_text(encoding="utf-8")))
    return out


@torch.no_grad()
def score(model, ids):
    logits = model(torch.tensor([ids])).logits[0]  # [n, vocab] float32
    logp = torch.log_softmax(logits.double(), dim=-1)
    logprobs = [None]
    tops = [None]
    for i in range(1, len(ids)):
        row = logp[i - 1]
        logprobs.append(float(row[ids[i]]))
        values, indices = torch.topk(row, TOP_K)
        tops.append([[int(t), float(v)] for t, v in zip(indices, values)])
    return logprobs, tops


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=pathlib.Path, default=default_model())
    args = ap.parse_args()
    model_path: pathlib.Path = args.model
    if not model_path.is_file():
        print(f"model not found: {model_path} (run scripts/fetch-model.sh)", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_path.parent), gguf_file=model_path.name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()

    FIXTURES.mkdir(parents=True, exist_ok=True)
    tok_dir = FIXTURES / "smollm2"
    tok_dir.mkdir(exist_ok=True)
    tok.save_pretrained(str(tok_dir))
    # compact JSON: the committed tokenizer reference stays near 2 MB
    tj = tok_dir / "tokenizer.json"
    tj.write_text(json.dumps(json.loads(tj.read_text(encoding="utf-8")), ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    stm = tok_dir / "special_tokens_map.json"
    if stm.exists():
        stm.unlink()

    texts = []
    total = 0
    for name, kind, text in load_texts(tok):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        logprobs, tops = score(model, ids)
        total += len(ids) - 1
        texts.append({"name": name, "kind": kind, "text": text, "token_ids": ids, "logprobs": logprobs, "top": tops})
        print(f"{name}: {len(ids)} tokens", file=sys.stderr)
    golden = {
        "model": MODEL_NAME,
        "model_sha256": sha256(model_path),
        "generator": {
            "script": "scripts/golden/generate.py",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "dtype": "float32 weights and activations; log_softmax in float64",
            "top_k": TOP_K,
        },
        "alignment": "logprobs[i] = log p(token_ids[i] | token_ids[:i]); logprobs[0] = null",
        "positions": total,
        "texts": texts,
    }
    (FIXTURES / "golden_smollm2.json").write_text(json.dumps(golden) + "\n", encoding="utf-8")

    print(f"{total} scored positions over {len(texts)} texts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
