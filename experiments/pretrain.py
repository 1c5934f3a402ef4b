"""The tiny pretrained model of the reproduction suite, built on first use and cached.

What it builds (deterministic given ``--seed``), under ``experiments/.cache/tiny-v<VERSION>-s<seed>/``:

* ``data/train.jsonl``, ``data/test.jsonl``: a synthetic two-step arithmetic task
  (``What is 59 + 7 - 1?``: a two-digit, b and c one-digit; gold ``65``) with columns ``question``,
  ``answer``, ``solution``; no test problem (same a, b, c) is in the training or pretraining data.
  ``gtpo.data.load_task`` reads them as local files and builds the paper's prompt
  (``gtpo.data.SYSTEM_PROMPT`` + the question, chat template applied).
* ``model/``: a ~1M-parameter Llama (ChatML template, EOS = PAD = ``<|im_end|>``) with a byte-level
  BPE tokenizer trained on the task's text (digits split one by one), pretrained from scratch with
  the project's own SFT (``gtpo.sft.run_sft``: TRL's ``SFTTrainer``, completion-only loss) on
  completions in the paper's format ``<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>``,
  in two phases (:data:`PRETRAIN`): first on the question alone (short, cheap examples: the model
  learns to copy the operands and add), then on the paper's prompt. The targets are deliberately
  noisy (a fraction with arithmetic slips, a fraction with a broken format) and the run is short, so
  that RL starts with a paper reward of roughly 10-60 % of its maximum, a format to fix and low
  accuracy to improve.
* ``start.json``: the measured starting point: parameter count, pretraining time, and, sampling
  at temperature 1 like the RL runs, the mean paper reward, format rate, accuracy and mean token
  entropy of the model on training prompts, plus greedy held-out accuracy.
* ``probes.json``: the probe texts of claim 1 (``{name: [prefix, target]}``): prefixes are real
  prompts of the test split rendered with the chat template (the text the policy sees).

Usage: ``python experiments/pretrain.py [--seed 0] [--force]``; the protocol's builders
(``protocol/startmodels.py``) and ``legacy/suite.py`` call :func:`ensure_tiny_model` / :func:`build` themselves. Nothing here is committed (``experiments/.gitignore``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CACHE = os.path.join(HERE, ".cache")
#: Bump when anything below changes what is built (the cache directory name carries it).
VERSION = 3

# ------------------------------------------------------------------------------------ the task
QUESTION_TEMPLATES = ("What is {e}?", "Compute {e}.", "Calculate {e}.", "How much is {e}?")

#: Pretraining target noise: probabilities of an arithmetic slip and of a broken format.
P_SLIP = 0.05
P_BROKEN = 0.35
#: Sizes: pretraining examples, RL training prompts, held-out problems.
N_PRETRAIN = 22000
N_TRAIN = 2000
N_TEST = 200
#: Model and pretraining budget (chosen once so that pretraining takes a few CPU minutes).
MODEL = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
VOCAB_SIZE = 640
#: Two phases: most steps on short prompts (the question alone, 3x cheaper per example) where the
#: model learns to copy the operands and to add; then the paper's prompt (system prompt + question).
PRETRAIN = (
    dict(template="none", max_steps=600, learning_rate=3e-3, batch_size=32, max_length=96, warmup_ratio=0.05,
         lr_scheduler_type="cosine"),
    dict(template="paper", max_steps=80, learning_rate=1e-3, batch_size=24, max_length=160, warmup_ratio=0.0,
         lr_scheduler_type="cosine"),
)


def make_problem(rng: random.Random) -> dict:
    """One problem ``a + b - c`` (a two-digit, b and c one-digit): question, gold answer, worked steps."""
    a, b, c = rng.randint(10, 99), rng.randint(1, 9), rng.randint(1, 9)
    s, r = a + b, a + b - c
    expr = f"{a} + {b} - {c}"
    return {"question": rng.choice(QUESTION_TEMPLATES).format(e=expr), "answer": str(r),
            "solution": f"{a} + {b} = {s}\n{s} - {c} = {r}", "_ops": (a, b, c)}


def clean_completion(problem: dict) -> str:
    """The paper-format completion (``gtpo.sft.format_target``'s layout)."""
    from gtpo.sft import format_target

    return format_target(problem["answer"], problem["solution"])


def noisy_completion(problem: dict, rng: random.Random) -> str:
    """A pretraining target: with probability P_SLIP an arithmetic slip in one of the two steps
    (carried to the answer, format intact); with probability P_BROKEN a broken format (correct
    arithmetic): no reasoning tags, no answer tags, text after the answer block, or no closing
    reasoning tag (paper format scores 1.0 / 1.0 / 1.5 / 1.5); otherwise the clean completion."""
    a, b, c = problem["_ops"]
    s = a + b
    r = s - c
    u = rng.random()
    if u < P_SLIP:
        d = rng.choice([-10, -1, 1, 10])
        if rng.random() < 0.5:
            s += d
            r = s - c
        else:
            r += d
    steps = f"{a} + {b} = {s}\n{s} - {c} = {r}"
    if u < P_SLIP or u >= P_SLIP + P_BROKEN:
        return f"<reasoning>\n{steps}\n</reasoning>\n<answer>\n{r}\n</answer>"
    kind = rng.randrange(4)
    if kind == 0:
        return f"{steps}\n<answer>\n{r}\n</answer>"
    if kind == 1:
        return f"<reasoning>\n{steps}\n</reasoning>\nThe answer is {r}."
    if kind == 2:
        return f"<reasoning>\n{steps}\n</reasoning>\n<answer>\n{r}\n</answer>\nDone."
    return f"<reasoning>\n{steps}\n<answer>\n{r}\n</answer>"


def make_splits(seed: int) -> tuple[list[dict], list[dict], list[dict]]:
    """(pretrain, train, test) problem lists; no test problem (same a, b, c) appears in the others."""
    rng = random.Random(seed)
    test, seen = [], set()
    while len(test) < N_TEST:
        p = make_problem(rng)
        if p["_ops"] not in seen:
            seen.add(p["_ops"])
            test.append(p)

    def draw(n: int) -> list[dict]:
        out = []
        while len(out) < n:
            p = make_problem(rng)
            if p["_ops"] not in seen:
                out.append(p)
        return out

    return draw(N_PRETRAIN), draw(N_TRAIN), test


# ------------------------------------------------------------------------------------ building
def cache_dir(seed: int = 0) -> str:
    return os.path.join(CACHE, f"tiny-v{VERSION}-s{seed}")


def build_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (digits split one by one) trained on ``texts``, ChatML template, EOS = PAD."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from gtpo.testing import CHATML_TEMPLATE

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", unk_token=None,
                                   pad_token="<|im_end|>")
    fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    return fast


def _write_jsonl(path: str, rows: list[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        for row in rows:
            fh.write(json.dumps({k: v for k, v in row.items() if not k.startswith("_")}) + "\n")
    os.replace(tmp, path)


def probe_texts(tokenizer, test: list[dict]) -> dict[str, list[str]]:
    """Claim 1's probes on two held-out problems: the opening format tag, the copied operands
    (a prefix every completion of a group shares), the tags between reasoning and answer, and the
    closing tag + EOS (a suffix every completion shares)."""
    from gtpo.data import make_prompt
    from gtpo.sampling.rollout import prompt_text

    out = {}
    for j, p in enumerate(test[:2]):
        prefix = prompt_text(tokenizer, make_prompt(p["question"], template="paper"))
        a, b, c = p["_ops"]
        s, r = a + b, a + b - c
        out[f"q{j}_open_tag"] = [prefix, "<reasoning>\n"]
        out[f"q{j}_copy_operands"] = [prefix + "<reasoning>\n", f"{a} + {b} = "]
        out[f"q{j}_answer_tags"] = [prefix + f"<reasoning>\n{a} + {b} = {s}\n{s} - {c} = {r}\n",
                                    "</reasoning>\n<answer>\n"]
        out[f"q{j}_close_eos"] = [prefix + f"<reasoning>\n{a} + {b} = {s}\n{s} - {c} = {r}\n</reasoning>\n"
                                  f"<answer>\n{r}\n", "</answer><|im_end|>"]
    return out


def measure_start(model_dir: str, train_path: str, test_path: str, *, seed: int, n_prompts: int = 64,
                  group_size: int = 8, max_new_tokens: int = 64) -> dict:
    """Starting reward and entropy of the pretrained model, sampled as the RL runs sample."""
    import torch

    from gtpo.data import load_task
    from gtpo.evaluation import evaluate_during_training
    from gtpo.evaluation.options import ScoringOptions
    from gtpo.run.models import load_model_and_tokenizer
    from gtpo.maths.ops import masked_mean
    from gtpo.rewards import format_reward, paper_reward
    from gtpo.sampling.rollout import generate
    from gtpo.sampling.policy import PolicyForward

    sys.path.insert(0, HERE)
    from rewards import paper_accuracy

    torch.manual_seed(seed)
    model, tok = load_model_and_tokenizer(model_dir)
    tok.padding_side = "left"
    model.eval()
    rows = load_task(train_path, size=n_prompts, seed=seed).to_list()
    roll = generate(model, tok, [r["prompt"] for r in rows], num_samples=group_size, max_new_tokens=max_new_tokens,
                    temperature=1.0)
    answers = [r["answer"] for r in rows for _ in range(group_size)]
    reward = paper_reward(completions=roll.texts, answer=answers)
    fmt = format_reward(completions=roll.texts)
    acc = paper_accuracy(completions=roll.texts, answer=answers)
    with torch.no_grad():
        ids = torch.cat([roll.prompt_ids, roll.completion_ids], 1)
        attn = torch.cat([roll.prompt_mask, roll.completion_mask], 1)
        _, ent = PolicyForward(model)(ids, attn, roll.completion_ids, 1.0)
        seq = masked_mean(ent, roll.completion_mask.float(), dim=1)
        token_mean = float((ent * roll.completion_mask).sum() / roll.completion_mask.sum())
    test = load_task(test_path)
    greedy = evaluate_during_training(model, tok, test, max_new_tokens=max_new_tokens, temperature=0.0,
                                      scoring=ScoringOptions(reward_fn=paper_accuracy))
    n = len(reward)
    return {
        "sampled_prompts": n_prompts, "group_size": group_size, "temperature": 1.0,
        "paper_reward_mean": sum(reward) / n, "paper_reward_frac_of_max": sum(reward) / n / 20.0,
        "format_rate": sum(fmt) / n, "accuracy": sum(acc) / n,
        "entropy_token_mean": token_mean, "entropy_completion_mean": float(seq.mean()),
        "entropy_completion_max": float(seq.max()),
        "frac_completions_entropy_above_0.7": float((seq > 0.7).float().mean()),
        "frac_groups_zero_reward_variance": float(
            sum(len(set(reward[i:i + group_size])) == 1 for i in range(0, n, group_size)) / n_prompts),
        "mean_length": float(roll.lengths.float().mean()), "truncated_frac": float(roll.truncated.float().mean()),
        "heldout_greedy_paper_accuracy": greedy["eval/accuracy_greedy"],
        "heldout_greedy_format_rate": greedy["eval/format_rate"],
        "samples": roll.texts[:4],
    }


def build(seed: int = 0, *, force: bool = False, log=print) -> str:
    """Build (or reuse) the cached tiny model + data; returns the cache directory."""
    out = cache_dir(seed)
    if os.path.isfile(os.path.join(out, "start.json")) and not force:
        return out
    import torch
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM

    from gtpo.data import SYSTEM_PROMPT, make_prompt
    from gtpo.sft import run_sft

    t0 = time.time()
    shutil.rmtree(out, ignore_errors=True)
    work = out + ".partial"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "data"))
    pre, train, test = make_splits(seed)
    rng = random.Random(seed + 1)
    targets = [noisy_completion(p, rng) for p in pre]
    _write_jsonl(os.path.join(work, "data", "train.jsonl"), train)
    _write_jsonl(os.path.join(work, "data", "test.jsonl"), test)

    chat = "<|im_start|>system\n{s}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
    corpus = [chat.format(s=SYSTEM_PROMPT, q=p["question"]) for p in pre[:4000]] + targets[:4000] + \
        [clean_completion(p) for p in train[:1000]]
    tok = build_tokenizer(corpus, VOCAB_SIZE)
    config = LlamaConfig(vocab_size=len(tok), tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, bos_token_id=None, **MODEL)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    params = sum(p.numel() for p in model.parameters())
    log(f"pretraining a {params / 1e6:.2f}M-parameter Llama (vocab {len(tok)}) on {len(pre)} noisy examples ...")
    model_dir = os.path.join(work, "model")
    t1 = time.time()
    offset = 0
    for i, phase in enumerate(PRETRAIN):
        opts = dict(phase)
        template = opts.pop("template")
        n = opts["max_steps"] * opts["batch_size"]
        rows = [pre[(offset + j) % len(pre)] for j in range(n)]
        rows_t = [targets[(offset + j) % len(pre)] for j in range(n)]
        offset += n
        data = Dataset.from_dict({
            "prompt": [make_prompt(p["question"], template=template) for p in rows],
            "completion": [[{"role": "assistant", "content": t}] for t in rows_t],
        })
        log(f"phase {i + 1}: {opts['max_steps']} steps on '{template}' prompts")
        out_i = model_dir if i == len(PRETRAIN) - 1 else os.path.join(work, f"phase{i + 1}")
        run_sft(model, tok, data, output_dir=out_i, seed=seed, logging_steps=25, **opts)
        if out_i != model_dir:
            from gtpo.run.models import load_model_and_tokenizer

            model, tok = load_model_and_tokenizer(out_i)
            shutil.rmtree(out_i)
    pretrain_s = time.time() - t1
    with open(os.path.join(work, "probes.json"), "w") as fh:
        json.dump(probe_texts(tok, test), fh, indent=1)
    log("measuring the starting reward and entropy ...")
    start = measure_start(model_dir, os.path.join(work, "data", "train.jsonl"),
                          os.path.join(work, "data", "test.jsonl"), seed=seed)
    start.update({"seed": seed, "version": VERSION, "parameters": params, "vocab_size": len(tok),
                  "model": MODEL, "pretrain": list(PRETRAIN), "pretrain_examples": len(pre), "p_slip": P_SLIP,
                  "p_broken": P_BROKEN, "pretrain_seconds": pretrain_s, "build_seconds": time.time() - t0,
                  "torch_threads": torch.get_num_threads()})
    with open(os.path.join(work, "start.json"), "w") as fh:
        json.dump(start, fh, indent=1)
    os.replace(work, out)
    return out


def ensure_tiny_model(seed: int = 0, log=print) -> str:
    """The cache directory of the tiny model (built if missing)."""
    return build(seed, log=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    out = build(args.seed, force=args.force)
    with open(os.path.join(out, "start.json")) as fh:
        start = json.load(fh)
    print(out)
    print(json.dumps({k: v for k, v in start.items() if k != "samples"}, indent=1))
    for s in start["samples"]:
        print(repr(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
