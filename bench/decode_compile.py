"""Benchmark (issue 46, a probe before building a compiled decode step): does a static key/value cache with the
model's forward compiled by ``torch.compile`` (inductor) sample faster than eager decoding on this CPU?

transformers already ships the remedy issue 46 names: ``model.generate(..., cache_implementation="static")``
preallocates the cache for ``prompt + max_new_tokens`` and compiles the one-token forward once
(``CompileConfig``; on a CPU only when asked: ``_compile_all_devices``). This script times it against eager
``generate`` (dynamic cache) and gtpo's decoding loop (``gtpo.sampling.rollout.generate``) on SmolLM2-135M-Instruct
(float32, the default task's prompts with the chat template, greedy, every row exactly ``--tokens`` tokens), sides
alternating over ``--rounds`` after one warm-up round each (the compiled side's first call, compilation included,
is reported apart), and checks that the three give the same tokens.

Usage: ``python bench/decode_compile.py [--rows 32] [--tokens 128] [--rounds 2] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    common.set_threads(args.threads)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, CompileConfig

    from gtpo.sampling.rollout import generate as gtpo_generate

    path = common.smollm2_model()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    prompts = common.default_task_prompts(4)
    texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    rows = (texts * (args.rows // len(texts) + 1))[:args.rows]
    enc = tok(rows, return_tensors="pt", padding=True)
    T = args.tokens
    compiled = CompileConfig()
    compiled._compile_all_devices = True  # transformers compiles on accelerators only unless asked
    fixed = dict(max_new_tokens=T, min_new_tokens=T, do_sample=False, pad_token_id=tok.pad_token_id)

    def eager():
        with torch.inference_mode():
            return model.generate(**enc, **fixed)[:, enc["input_ids"].shape[1]:]

    def static_compiled():
        with torch.inference_mode():
            return model.generate(**enc, **fixed, cache_implementation="static",
                                  compile_config=compiled)[:, enc["input_ids"].shape[1]:]

    def loop():
        model.generation_config.min_new_tokens = T
        try:
            r = gtpo_generate(model, tok, [[{"role": "user", "content": m[-1]["content"]}] for m in prompts],
                              num_samples=args.rows // len(prompts), max_new_tokens=T, temperature=0.0)
        finally:
            model.generation_config.min_new_tokens = None
        return r.completion_ids

    sides = {"generate (eager)": eager, "generate (static cache, compiled)": static_compiled,
             "gtpo decoding loop": loop}
    first, times, outs = {}, {k: [] for k in sides}, {}
    for name, fn in sides.items():
        t0 = time.perf_counter()
        outs[name] = fn()
        first[name] = time.perf_counter() - t0
    for r in range(args.rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            t0 = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - t0)
    a = outs["generate (eager)"]
    same = {name: bool(torch.equal(a, o[:, :a.shape[1]].to(a.device))) if o.shape[0] == a.shape[0] else None
            for name, o in outs.items()}
    print(f"SmolLM2-135M float32, {args.rows} rows x {T} tokens, greedy, {args.threads} threads, {common.machine()}")
    print(common.table(["side", "first call s", "median s", "tokens/s", "same tokens as eager generate"],
                       [[n, common.fmt(first[n]), common.fmt(statistics.median(times[n])),
                         common.fmt(args.rows * T / statistics.median(times[n])), same[n]] for n in sides]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
