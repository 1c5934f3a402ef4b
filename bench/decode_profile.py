"""Benchmark (issue 46 (a)): where a step of gtpo's decoding loop goes, and its roofline.

One rollout of SmolLM2-135M-Instruct (float32, the default run's held-out prompts, P = 4 x G rows, exactly
``--tokens`` new tokens each: no row ends, every step has all rows) through ``gtpo.sampling.rollout.generate``
(eager loop), its decoding loop (not the prompt prefill) under ``torch.profiler`` (shapes recorded), after one
warm-up rollout. The self CPU time of the
operators is grouped: the layers' matmuls, the LM head's matmul (the ``(rows, 576) x (576, 49,152)`` product), CPU
SDPA attention, sampling (softmax, cumsum, searchsorted, rand, isin, argmax), the cache (copies and row selection),
other elementwise work (norms, rotary, SiLU, residuals); the rest of the wall time is Python and dispatch. Then the
roofline: the decoding steps' FLOPs (every projection and the head per row and token, attention over the cache)
over the loop's unprofiled wall time, as a fraction of this
process's matmul peak (``common.matmul_peak``) and of the rate the same-shaped matmuls reach alone (each layer's
and the head's product timed on their own: what the hardware gives a 32-row product, weights streamed from memory
once per token as in decoding).

Usage: ``python bench/decode_profile.py [--group 8] [--tokens 16] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

GROUPS = {
    "sampling": ("aten::_softmax", "aten::cumsum", "aten::searchsorted", "aten::uniform_", "aten::isin", "aten::argmax",
                 "aten::clamp_", "aten::rand"),
    "attention (SDPA)": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
                         "aten::bmm"),
    "cache (copies, row selection)": ("aten::copy_", "aten::index", "aten::index_select", "aten::cat", "aten::slice_scatter"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=int, default=8, help="G: rows = 4 x G")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    common.set_threads(args.threads)

    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gtpo.sampling.rollout import generate

    path = common.smollm2_model(args.tokens)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = common.default_task_prompts(4, split="test")
    rows = 4 * args.group
    vocab, hidden = model.config.vocab_size, model.config.hidden_size

    import gtpo.sampling.rollout as rollout_module

    plain_decode = rollout_module.decode
    state = {"prof": None, "decode_s": 0.0}

    def decode(*a, **kw):  # the decoding loop alone (the prompt prefill before it is not counted)
        t0 = time.perf_counter()
        if state["prof"] is None:
            out = plain_decode(*a, **kw)
        else:
            with state["prof"]:
                out = plain_decode(*a, **kw)
        state["decode_s"] = time.perf_counter() - t0
        return out

    rollout_module.decode = decode

    def rollout(prof=None):
        state["prof"] = prof
        torch.manual_seed(0)
        generate(model, tok, prompts, num_samples=args.group, max_new_tokens=args.tokens, temperature=0.7, top_k=0,
                 decode_compile=False)
        return state["decode_s"]

    print(common.machine())
    rollout()
    peak = common.matmul_peak("float32")
    wall = rollout()
    shape = common.transformer_shape(model.config)
    prompt = max(len(ids) for ids in __import__("gtpo.sampling.rollout", fromlist=["encode_prompts"]).encode_prompts(
        tok, prompts))
    # the decode steps' FLOPs: every projection and the head for each row and token, attention over the cache
    flops = sum(2 * rows * (shape["linear"] + shape["vocab"] * shape["hidden"])
                + 4 * rows * shape["layers"] * shape["attn"] * (prompt + t) for t in range(args.tokens))
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
    wall_prof = rollout(prof)
    totals = {"layer matmuls": 0.0, "LM head matmul": 0.0, "other elementwise (norms, rotary, SiLU, ...)": 0.0}
    totals.update({k: 0.0 for k in GROUPS})
    for ev in prof.key_averages(group_by_input_shape=True):
        us = ev.self_cpu_time_total
        if ev.key in ("aten::mm", "aten::addmm"):
            shapes = ev.input_shapes or []
            is_head = any(vocab in s for s in shapes if isinstance(s, list))
            totals["LM head matmul" if is_head else "layer matmuls"] += us
            continue
        for group, names in GROUPS.items():
            if ev.key in names:
                totals[group] += us
                break
        else:
            if ev.key.startswith("aten::"):
                totals["other elementwise (norms, rotary, SiLU, ...)"] += us
    ops = sum(totals.values()) / 1e6
    totals["Python, dispatch (decode wall - operators)"] = max(wall_prof * 1e6 - ops * 1e6, 0.0)
    print(f"SmolLM2-135M float32, {rows} rows x {args.tokens} forced tokens, {args.threads} thread(s): the decoding "
          f"loop {wall:.2f} s unprofiled ({rows * args.tokens / wall:.1f} tok/s, {1e3 * wall / args.tokens:.0f} ms "
          f"per token step), {wall_prof:.2f} s profiled")
    whole = sum(totals.values())
    print(common.table(["where (the decoding loop)", "s (self CPU)", "share"],
                       [[k, f"{v / 1e6:.2f}", f"{v / whole:.3f}"] for k, v in sorted(totals.items(), key=lambda x: -x[1])]))

    # the same-shaped matmuls alone: the rate a decode step's products reach here
    layer = model.model.layers[0]
    mats = [m.weight for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                               layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
    head = model.lm_head.weight

    def best(fn, reps=5):
        fn()
        out = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out = min(out, time.perf_counter() - t0)
        return out

    with torch.inference_mode():
        t_layer = sum(best(lambda w=w: torch.nn.functional.linear(torch.randn(rows, w.shape[1]), w)) for w in mats)
        x = torch.randn(rows, hidden)
        t_head = best(lambda: torch.nn.functional.linear(x, head))
    f_layer = sum(2 * rows * w.numel() for w in mats)
    f_head = 2 * rows * head.numel()
    step_floor = t_layer * model.config.num_hidden_layers + t_head
    print(f"matmuls alone ({rows} rows, weights warm in cache for the layers): one layer's 7 products "
          f"{1e3 * t_layer:.2f} ms ({f_layer / t_layer / 1e9:.1f} GFLOP/s), the head {1e3 * t_head:.1f} ms "
          f"({f_head / t_head / 1e9:.1f} GFLOP/s, {4 * head.numel() / t_head / 1e9:.2f} GB/s of weights); a step's "
          f"products alone: {1e3 * step_floor:.0f} ms")
    print(f"roofline: decoding {flops / 1e9:.1f} GFLOP in {wall:.2f} s = {flops / wall / 1e9:.1f} GFLOP/s; fraction of "
          f"the matmul peak ({peak / 1e9:.1f} GFLOP/s, 2048^2): {flops / wall / peak:.3f}; the step's time / its "
          f"matmuls alone: {wall / args.tokens / step_floor:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
