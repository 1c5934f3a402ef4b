"""Benchmark: our training step against the sum of its unavoidable parts, measured alone.

The unavoidable parts of an on-policy step, on the same model, batch shape and settings as the
trainer's step (``P`` prompts x ``G`` completions x exactly ``T`` sampled tokens, temperature 1,
fp32, ``--threads 2``; the model of ``bench/trainer_vs_trl.py``):

* ``generate``: one plain transformers ``model.generate`` call sampling the ``P * G`` completions
  of the same prompts (left-padded, the batch of ``P * G`` rows; nothing else);
* ``fwd+bwd+opt``: one forward of the ``(P * G, S + T)`` prompt+completion batch (plain
  transformers forward, logits of the completion positions, ``log_softmax``, gather), a
  masked-mean log-prob loss, backward, ``AdamW.step()`` and ``zero_grad``, on a separate copy of
  the model with its own optimizer.

The trainer's step (``GTPOTrainer.step()``: rollout, rewards, advantages, GTPO's conflict
weights and entropy control, the loss, backward, clipping, optimizer and scheduler steps,
metrics) is timed in the same process, interleaved with the two parts in alternating order
(ABBA), ``--warmup`` + ``--steps`` rounds; per round (same load) the ratio of the step to the sum
of the two parts, and its median over the rounds is the result (the ratio of the medians and of
the median CPU times are printed too):

    ratio = median over rounds of step / (generate + fwd+bwd+opt),  goal <= 1.15.

A ratio below 1 is possible: the trainer shares each prompt's work between the G completions of
its group (``gtpo.sampling.rollout``: one prefill per prompt; one prompt forward per group in the update)
where the plain parts process every row. The trainer's own split (its ``generation_time_s`` and
``update_time_s`` metrics) is printed next to the parts. The machine is shared and noisy: only
ratios measured in the same run mean anything.

The roofline is printed too: the step's FLOPs (``common.spec_step_flops``, counted from the model
config and the token counts: the rollout's forward, the update's forward and backward, each prompt
once per group) over the median time of each part, for the trainer's rollout and update and for
the two plain parts, as a fraction of the float32 matmul peak (``common.matmul_peak``, measured
before each round).

Usage: ``python bench/limit.py [--steps 10] [--warmup 2] [--loss-type gtpo] [--check]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

GOAL = 1.15


def worker(spec: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from gtpo.run.metric_names import canonical_record
    from gtpo.sampling.padding import left_pad

    common.set_threads(spec["threads"])
    path = common.bench_model(spec)
    tmp = common.scratch_dir()
    trainer = common.ours_trainer(path, spec, spec["loss_type"], os.path.join(tmp, "ours"))

    # the parts, on their own model and optimizer
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    P, G, T = spec["P"], spec["G"], spec["length"]
    prompt_rows = [tok(p)["input_ids"] for p in common.prompts(spec)[:P] for _ in range(G)]
    prompt_ids, prompt_mask = left_pad(prompt_rows, tok.pad_token_id)
    gen_config = GenerationConfig(max_new_tokens=T, do_sample=True, temperature=1.0, top_p=1.0,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    batch = {}

    @torch.no_grad()
    def generate():
        model.eval()
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=gen_config)
        model.train()
        batch["ids"] = out
        batch["mask"] = torch.cat([prompt_mask, torch.ones_like(out[:, prompt_ids.shape[1]:])], dim=1)

    def update():
        ids, mask = batch["ids"], batch["mask"]
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=T + 1).logits[:, :-1]  # (N, T, V)
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, -T:, None]).squeeze(-1)  # (N, T)
        loss = -(logp * mask[:, -T:]).sum() / mask[:, -T:].sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = {"step": [], "generate": [], "fwd+bwd+opt": [], "step_generation": [], "step_update": []}
    cpu = {"step": [], "generate": [], "fwd+bwd+opt": []}
    tokens = []

    def step():
        with common.Timer(times["step"], cpu["step"]):
            metrics = canonical_record(trainer.step())  # the current metric names, whichever the trainer writes
        times["step_generation"].append(metrics["gtpo/generation_time"])
        times["step_update"].append(metrics["gtpo/update_time"])
        tokens.append(metrics["completions/mean_length"])

    def gen():
        with common.Timer(times["generate"], cpu["generate"]):
            generate()

    def upd():
        with common.Timer(times["fwd+bwd+opt"], cpu["fwd+bwd+opt"]):
            update()

    peaks = []
    for r in range(spec["warmup"] + spec["steps"]):
        peaks.append(common.matmul_peak("float32"))  # the machine's matmul rate next to this round
        order = (step, gen, upd) if r % 2 == 0 else (gen, upd, step)  # upd needs a batch from gen
        for fn in order:
            fn()
    assert batch["ids"].shape[1] - prompt_ids.shape[1] == T, "generate did not produce exactly T tokens"
    return {"times": times, "cpu": cpu, "tokens": tokens, "params": common.n_params(path),
            "prompt_width": int(prompt_ids.shape[1]), "peaks": peaks, "flops": common.spec_step_flops(path, spec)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--loss-type", default="gtpo", choices=["gtpo", "grpo", "dr_grpo", "dapo"])
    common.add_batch_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0

    spec = common.batch_spec(args, steps=args.steps, warmup=args.warmup, loss_type=args.loss_type)
    print(common.machine())
    common.bench_model(spec)
    res = common.run_worker(__file__, spec)
    print(f"model: Llama, {res['params'] / 1e6:.2f} M parameters, vocab {args.vocab}; P={args.prompts} x "
          f"G={args.group} x T={args.length} tokens, prompts padded to {res['prompt_width']} tokens; "
          f"{args.threads} threads; loss_type {args.loss_type}; {args.warmup} warm-up + {args.steps} measured rounds")
    w = args.warmup
    med = {k: common.median(v[w:]) for k, v in res["times"].items()}
    for k in ("step", "generate", "fwd+bwd+opt"):
        print(f"  {k:12s} times (s): " + " ".join(f"{x:.2f}" for x in res["times"][k]))
    limit = med["generate"] + med["fwd+bwd+opt"]
    rows = [
        ["trainer step", f"{med['step']:.3f}", "generation", f"{med['step_generation']:.3f}",
         "update", f"{med['step_update']:.3f}"],
        ["unavoidable parts", f"{limit:.3f}", "generate", f"{med['generate']:.3f}",
         "fwd+bwd+opt", f"{med['fwd+bwd+opt']:.3f}"],
    ]
    print(common.table(["", "median s", "part", "median s", "part", "median s"], rows))
    # per round: the step against the two parts measured next to it (same load); median over rounds
    paired = common.median(st / (g + u) for st, g, u in zip(res["times"]["step"][w:], res["times"]["generate"][w:],
                                                            res["times"]["fwd+bwd+opt"][w:]))
    ratio = paired
    of_medians = med["step"] / limit
    cpu = {k: common.median(v[w:]) for k, v in res["cpu"].items()}
    cpu_ratio = cpu["step"] / (cpu["generate"] + cpu["fwd+bwd+opt"])
    print(f"step / (generate + fwd+bwd+opt): {ratio:.3f} (median of per-round ratios; goal <= {GOAL}); ratio of "
          f"medians {of_medians:.3f}; generation part "
          f"{med['step_generation'] / med['generate']:.3f}x "
          f"plain generate, update part {med['step_update'] / med['fwd+bwd+opt']:.3f}x plain fwd+bwd+opt; "
          f"the same ratio on median CPU times: {cpu_ratio:.3f}")
    # the roofline: the step's FLOPs (rollout forward; update forward + backward) over each part's time, as a
    # fraction of the float32 matmul peak measured before the round; per round, median over rounds
    flops, peaks = res["flops"], res["peaks"][w:]
    parts = {"trainer step": ("step_generation", "step_update"), "plain parts": ("generate", "fwd+bwd+opt")}
    roof = []
    for name, (gen_key, upd_key) in parts.items():
        for part, key in (("rollout", gen_key), ("update", upd_key)):
            t = res["times"][key][w:]
            frac = common.median(flops[part] / x / p for x, p in zip(t, peaks))
            roof.append([name, f"{part} ({key})", f"{flops[part] / 1e9:.2f}", f"{common.median(t):.3f}",
                         f"{flops[part] / common.median(t) / 1e9:.1f}", f"{frac:.3f}"])
    print(f"roofline: FLOPs from the model config and token counts (prompts once per group); float32 matmul peak "
          f"(2048^2, before each round) median {common.median(peaks) / 1e9:.1f} GFLOP/s")
    print(common.table(["", "part", "GFLOP", "median s", "GFLOP/s", "fraction of peak"], roof))
    if args.check and ratio > GOAL:
        print("GOAL MISSED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
