"""Benchmark: peak memory of a training step at a 49k vocabulary, with and without the chunked
log-prob/entropy path.

One GTPO training step of this project's trainer (``GTPOTrainer.step()``: rollout, rewards,
conflict weights, forward, loss, backward, optimizer) on a random Llama with SmolLM2's
vocabulary size (V = 49,152; ``--hidden 128 --layers 2``, 6.6 M parameters of which the tied
embedding / LM head holds 6.3 M), P = 2 prompts x G = 8 completions x
T = 64 tokens, fp32, in two variants:

* ``chunked``: the trainer as it is: log-probs and entropies come from
  ``gtpo.maths.ops.token_logprobs_and_entropy`` (chunks of ~64 MiB of logits, recomputed in the
  backward pass; the ``(N, T, V)`` logits never exist);
* ``full``: the same trainer with that one function swapped (in ``gtpo.sampling.policy``'s namespace)
  for the obvious full-logits path (``tests/reference_impl.naive_token_logprobs_and_entropy``:
  ``logits = hidden @ W.T`` for every completion token, ``log_softmax``, ``gather``, entropy from
  the log-probs), which is what a trainer without the chunked path does.

Each measurement runs in a FRESH process: build the trainer, run one warm-up step, reset the
process's peak RSS (``/proc/self/clear_refs``), record the RSS, run one step, read the peak
(``VmHWM``). Reported: the step's peak growth (peak during the step minus the RSS before it: the
memory the step itself needs, on top of the libraries, model and optimizer state that are
resident anyway) and the absolute peak RSS during the step. The variants alternate (ABBA) for
``--repeats`` rounds; medians are compared. Goal: chunked/full <= 0.5 for the step's peak growth
(the absolute peak ratio is printed too). The full logits of the batch are
``N * T * V * 4`` bytes = 192 MiB here (several copies exist at once on the full path).
Memory, unlike time, hardly varies between runs: one round is the default.

Usage: ``python bench/step_memory.py [--repeats 1] [--check]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

GOAL = 0.5


def worker(spec: dict) -> dict:
    import gtpo.sampling.policy as gp

    common.set_threads(spec["threads"])
    path = common.bench_model(spec)
    if spec["variant"] == "full":
        sys.path.insert(0, os.path.join(common.REPO, "tests"))
        from reference_impl import naive_token_logprobs_and_entropy

        def full_logits(hidden, weight, targets, *, temperature=1.0, chunk_size=None, bias=None):
            return naive_token_logprobs_and_entropy(hidden, weight, targets, temperature=temperature, bias=bias)

        gp.token_logprobs_and_entropy = full_logits
    out_dir = os.path.join(common.scratch_dir(), "run")
    trainer = common.ours_trainer(path, spec, spec["loss_type"], out_dir)
    trainer.step()  # warm-up: optimizer state, kernels, allocator
    common.peak_rss_reset()
    before = common.rss_bytes()
    metrics = trainer.step()
    peak = common.peak_rss_bytes()
    return {"variant": spec["variant"], "before": before, "peak": peak, "growth": peak - before,
            "step_time_s": metrics["step_time"], "entropy": metrics["entropy"],
            "vocab": trainer.unwrapped_model.config.vocab_size, "params": common.n_params(path)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="rounds of (full, chunked), ABBA order")
    parser.add_argument("--loss-type", default="gtpo", choices=["gtpo", "grpo", "dr_grpo", "dapo"])
    common.add_batch_arguments(parser, hidden=128, layers=2, vocab=49_152)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0

    spec = common.batch_spec(args, loss_type=args.loss_type)
    print(common.machine())
    common.bench_model(spec)
    n = args.prompts * args.group
    print(f"one {args.loss_type} step, N = {args.prompts} x {args.group} completions x T = {args.length} tokens, "
          f"V = {args.vocab}: full logits {n * args.length * args.vocab * 4 / 2**20:.0f} MiB (fp32)")
    results = {"full": [], "chunked": []}
    for r in range(args.repeats):
        for variant in (("full", "chunked") if r % 2 == 0 else ("chunked", "full")):
            res = common.run_worker(__file__, {**spec, "variant": variant})
            results[variant].append(res)
            print(f"  round {r + 1} {variant:7s}: step peak growth {res['growth'] / 2**20:6.0f} MiB, peak RSS "
                  f"{res['peak'] / 2**20:6.0f} MiB (RSS before {res['before'] / 2**20:.0f} MiB), "
                  f"step {res['step_time_s']:.2f} s, entropy {res['entropy']:.3f}", flush=True)
    print(f"model: Llama, {results['full'][0]['params'] / 1e6:.2f} M parameters, vocab {results['full'][0]['vocab']}")
    med = {v: {k: common.median(x[k] for x in rs) for k in ("growth", "peak", "step_time_s")}
           for v, rs in results.items()}
    rows = [[v, f"{med[v]['growth'] / 2**20:.0f}", f"{med[v]['peak'] / 2**20:.0f}", f"{med[v]['step_time_s']:.2f}"]
            for v in ("full", "chunked")]
    print(common.table(["log-prob/entropy path", "step peak growth MiB", "peak RSS MiB", "step s"], rows))
    growth_ratio = med["chunked"]["growth"] / med["full"]["growth"]
    peak_ratio = med["chunked"]["peak"] / med["full"]["peak"]
    print(f"step peak growth chunked/full: {growth_ratio:.3f} (goal <= {GOAL}); absolute peak RSS chunked/full: "
          f"{peak_ratio:.3f}")
    if args.check and growth_ratio > GOAL:
        print("GOAL MISSED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
