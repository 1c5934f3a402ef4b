"""Benchmark: GTPO on TRL's engine (``gtpo.integrations.trl.TRLGTPOTrainer``) against plain TRL
``GRPOTrainer``: the step time GTPO adds to TRL's loop.

Both trainers are ``common.trl_trainer``'s TRL setup (the same tiny random Llama, ``--hidden 256
--layers 4 --vocab 512``; the same 8 prompts and cheap reward; ``P = 2`` prompts x ``G = 8``
completions per optimizer step, ``T = 64`` sampled tokens each, forced by the model's generation
config, so every step of both samples exactly ``P x G x T`` tokens -- checked; temperature 1,
transformers ``generate``, no KL, one update per batch, fp32, no activation checkpointing,
``--threads 2``). TRL runs ``loss_type="grpo"``; GTPO runs ``loss_type="gtpo"`` with GTPOConfig's
defaults (the official preset's method: conflict weights 2.0 / 0.0, product, ``max_run`` count, sum
over the group, gamma 0.1) except ``entropy_threshold = 100`` (a random model's completions have
~6 nats of entropy: the default 0.7 would filter every completion; the work done is the same).

What GTPO adds to a TRL step: the conflict weights and runs on the rollout batch, the exact zeros of
zero-variance groups, the entropy control and ``gtpo_loss`` on each micro-batch, and its metrics
(one reduce per micro-batch). The generation-time part is also timed inside the real steps and printed as
a share of the step. The roofline of each side (``common.print_roofline``: the step's FLOPs over the
time of its rollout and update, as a fraction of the float32 matmul peak measured before each step)
follows.

Timing: ONE process holds both trainers, each running its own ``train()`` in a thread; a baton
(callbacks on ``on_step_begin`` / ``on_step_end``) lets exactly one step run at a time, in the order
TRL, GTPO, GTPO, TRL, TRL, GTPO, ... so drifts of the machine's load hit both alike (one more, untimed
step of each follows, so that neither's end of ``train()`` overlaps a timed step). A step is timed
from its ``on_step_begin`` to its ``on_step_end`` (generation, rewards, forward, backward, clipping,
optimizer). The first ``--warmup`` steps of each are dropped. The overhead is the median over rounds
of the paired ratio GTPO/TRL (the two steps of a round run back to back) minus 1; also printed: the
ratio of the medians, of the median CPU times (``time.process_time``: the waiting thread uses none),
and the minima. The machines are shared: only same-run, interleaved ratios mean anything.

Goal: GTPO's overhead over TRL's step <= 5 %; ``--check`` exits 1 when it is missed.

Usage: ``python bench/trl_engine.py [--steps 10] [--warmup 2] [--check]`` (and ``common``'s batch
options: ``--prompts --group --length --hidden --layers --vocab --threads --paper-prompts``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

GOAL = 0.05
KINDS = ("trl", "gtpo")
BATON_TIMEOUT_S = 1800


def interleaved_worker(spec: dict) -> dict:
    """Steps of TRL's GRPOTrainer and of TRLGTPOTrainer, alternating in this process: times and tokens."""
    from transformers import TrainerCallback

    from gtpo.integrations.trl import TRLGTPOConfig, TRLGTPOTrainer

    common.set_threads(spec["threads"])
    path = common.bench_model(spec)
    tmp = common.scratch_dir()
    n_rows = spec["P"] * spec["G"]
    steps = spec["warmup"] + spec["steps"]
    order = [kind for k in range(steps) for kind in (KINDS if k % 2 == 0 else KINDS[::-1])]
    baton = threading.Condition()
    state = {"turn": 0, "error": None}
    times = {k: [] for k in KINDS}
    cpu = {k: [] for k in KINDS}
    tokens = {k: [] for k in KINDS}
    generation = {k: [] for k in KINDS}
    peaks = {k: [] for k in KINDS}
    trainers = {}

    class Baton(TrainerCallback):
        def __init__(self, kind: str):
            self.kind = kind

        def on_step_begin(self, args, state_, control, **kw):
            # a timed step waits for its turn; the one untimed step after them waits until every timed step
            # is done (so that the end of one trainer's train() never overlaps a timed step of the other)
            with baton:
                ok = baton.wait_for(lambda: state["error"] is not None or state["turn"] >= len(order)
                                    or order[state["turn"]] == self.kind, timeout=BATON_TIMEOUT_S)
                self.timed = state["turn"] < len(order)
            if not ok or state["error"] is not None:
                raise RuntimeError(f"{self.kind}: the other trainer stopped ({state['error'] or 'timeout'})")
            if self.timed:
                peaks[self.kind].append(common.matmul_peak())  # the machine's matmul rate next to this step
                self.timer = common.Timer(times[self.kind], cpu[self.kind]).__enter__()

        def on_step_end(self, args, state_, control, **kw):
            if not self.timed:
                return
            self.timer.__exit__(None, None, None)
            lengths = trainers[self.kind]._metrics["train"]["completions/mean_length"]
            tokens[self.kind].append(lengths[-1] * n_rows)
            with baton:
                state["turn"] += 1
                baton.notify_all()

    trainers["trl"] = common.trl_trainer(path, spec, os.path.join(tmp, "trl"), steps + 1, callbacks=[Baton("trl")])
    trainers["gtpo"] = common.trl_trainer(path, spec, os.path.join(tmp, "gtpo"), steps + 1, callbacks=[Baton("gtpo")],
                                          config_cls=TRLGTPOConfig, trainer_cls=TRLGTPOTrainer, loss_type="gtpo",
                                          scale_rewards=None, entropy_threshold=100.0)

    # GTPO's additions at generation time (exact zeros, conflict weights and runs, masks, metrics), timed
    # inside the real steps: a noise-free view of the work the loop adds
    inputs_time: list[float] = []
    gtpo_inputs = trainers["gtpo"]._gtpo_inputs

    def timed_inputs(batch):
        with common.Timer(inputs_time):
            return gtpo_inputs(batch)

    trainers["gtpo"]._gtpo_inputs = timed_inputs

    for kind, trainer in trainers.items():  # each step's sampling (generate + decoding the texts), for the roofline
        def timed_generate(*a, _sample=trainer._generate, _kind=kind, **kw):
            with common.Timer(generation[_kind]):
                return _sample(*a, **kw)

        trainer._generate = timed_generate

    def run(kind: str) -> None:
        try:
            trainers[kind].train()
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            with baton:
                state["error"] = state["error"] or f"{kind}: {type(err).__name__}: {err}"
                baton.notify_all()

    threads = [threading.Thread(target=run, args=(kind,), name=kind) for kind in KINDS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if state["error"]:
        raise RuntimeError(state["error"])
    return {"times": times, "cpu": cpu, "tokens": tokens, "params": common.n_params(path),
            "gtpo_inputs": inputs_time[:len(times["gtpo"])],
            "generation": {k: v[:len(times[k])] for k, v in generation.items()}, "peaks": peaks,
            "flops": common.spec_step_flops(path, spec)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per trainer (after warm-up)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps per trainer (not measured)")
    common.add_batch_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(interleaved_worker(json.loads(args.worker))))
        return 0

    spec = common.batch_spec(args, steps=args.steps, warmup=args.warmup)
    print(common.machine())
    common.bench_model(spec)  # build once, outside the timed process
    res = common.run_worker(__file__, spec)
    print(f"model: Llama, {res['params'] / 1e6:.2f} M parameters, hidden {args.hidden}, {args.layers} layers, vocab "
          f"{args.vocab}; P={args.prompts} x G={args.group} completions x T={args.length} tokens per step, "
          f"{args.threads} threads; {args.warmup} warm-up + {args.steps} measured steps each, interleaved; both on "
          f"TRL's engine with transformers generate")
    expected = args.prompts * args.group * args.length
    if not common.all_steps_sampled(res["tokens"], expected):
        return 1
    w = args.warmup
    for k in KINDS:
        print(f"  {k:5s} step wall times (s): " + " ".join(f"{x:.2f}" for x in res["times"][k]))
    med = {k: common.median(res["times"][k][w:]) for k in KINDS}
    cpu = {k: common.median(res["cpu"][k][w:]) for k in KINDS}
    low = {k: min(res["times"][k][w:]) for k in KINDS}
    paired = common.median(g / t for g, t in zip(res["times"]["gtpo"][w:], res["times"]["trl"][w:]))
    names = {"trl": "TRL GRPOTrainer (grpo)", "gtpo": "TRLGTPOTrainer (gtpo)"}
    rows = [[names[k], f"{med[k]:.3f}", f"{low[k]:.3f}", f"{cpu[k]:.3f}", f"{expected / med[k]:.0f}",
             f"{med[k] / med['trl']:.3f}", f"{cpu[k] / cpu['trl']:.3f}"] for k in KINDS]
    print(common.table(["trainer", "median step s", "min step s", "median CPU s", "tokens/s", "wall / TRL",
                        "CPU / TRL"], rows))
    overhead = paired - 1.0
    print(f"GTPO overhead on TRL's engine: {overhead:+.1%} (median of paired step-time ratios {paired:.3f}; goal <= "
          f"{GOAL:.0%}); ratio of medians {med['gtpo'] / med['trl']:.3f}, of median CPU times "
          f"{cpu['gtpo'] / cpu['trl']:.3f}, of minima {low['gtpo'] / low['trl']:.3f}")
    inputs_ms = common.median(res["gtpo_inputs"][w:]) * 1000
    print(f"GTPO's generation-time inputs (conflict weights and runs, masks, metrics): median {inputs_ms:.1f} ms per "
          f"step = {inputs_ms / 1000 / med['gtpo']:.2%} of the GTPO step")
    common.print_roofline(res["flops"], {k: res["times"][k][w:] for k in KINDS},
                          {k: res["generation"][k][w:] for k in KINDS}, {k: res["peaks"][k][w:] for k in KINDS},
                          "float32")
    if args.check and overhead > GOAL:
        print("GOAL MISSED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
