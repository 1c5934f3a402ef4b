"""Tests of gtpo.sft: paper-format targets, TRL prompt-completion rows, completion-only loss,
an SFT run that teaches the format to a tiny random model, and the saved model directories."""

import json
import math
import os
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")
torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from gtpo.data import SYSTEM_PROMPT, load_task, make_prompt  # noqa: E402
from gtpo.rewards import paper_format_score, paper_score  # noqa: E402
from gtpo.sft import (  # noqa: E402
    GENERIC_REASONING,
    METRICS_FILE,
    build_sft_dataset,
    build_sft_trainer,
    format_target,
    reasoning_from_row,
    run_sft,
)

FIXTURES = Path(__file__).parent / "fixtures" / "data"

GSM8K_RATIONALE = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)
GSM8K_CLEAN = (
    "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May."
)


# --------------------------------------------------------------------------------------------
# format_target / reasoning_from_row
# --------------------------------------------------------------------------------------------


def test_format_target_golden():
    assert format_target("7", "3 + 4 = 7") == "<reasoning>\n3 + 4 = 7\n</reasoning>\n<answer>\n7\n</answer>"
    # the answer is str()-ed and stripped, the reasoning stripped
    assert format_target(72, "  48 + 24 = 72 \n") == (
        "<reasoning>\n48 + 24 = 72\n</reasoning>\n<answer>\n72\n</answer>"
    )


def test_format_target_strips_gsm8k_markup():
    # calculator annotations <<...>> and the trailing "#### 72" removed (worked out by hand above)
    assert format_target("72", GSM8K_RATIONALE) == (
        f"<reasoning>\n{GSM8K_CLEAN}\n</reasoning>\n<answer>\n72\n</answer>"
    )
    # idempotent on an already clean rationale (what gtpo.data's GSM8K rows carry)
    assert format_target("72", GSM8K_CLEAN) == format_target("72", GSM8K_RATIONALE)


@pytest.mark.parametrize("reasoning", [None, "", "  \n", "#### 5"])
def test_format_target_generic_reasoning(reasoning):
    line = "I work out the answer step by step; the final answer is 5."
    assert GENERIC_REASONING.format(answer="5") == line
    assert format_target("5", reasoning) == f"<reasoning>\n{line}\n</reasoning>\n<answer>\n5\n</answer>"


def test_format_target_earns_full_paper_reward():
    # paper format: reasoning block + answer block ending the text = 10; with the gold answer 20
    target = format_target("72", GSM8K_RATIONALE)
    assert paper_format_score(target) == 10.0
    assert paper_score(target, "72") == 20.0
    assert paper_score(format_target("-3/4", None), "-3/4") == 20.0


@pytest.mark.parametrize("answer", [None, "", "   "])
def test_format_target_rejects_empty_answer(answer):
    with pytest.raises(ValueError, match="answer"):
        format_target(answer, "r")


def test_format_target_rejects_non_string_reasoning():
    with pytest.raises(ValueError, match="reasoning"):
        format_target("1", ["not", "text"])


def test_reasoning_from_row_sources():
    entry = {"question": "Calculate 3 + 4.", "answer": "7", "metadata": {"expression": "3 + 4"}}
    assert reasoning_from_row({"answer": "7", "rg_entry": json.dumps(entry)}) == "3 + 4 = 7"
    # a solution column wins over rg_entry
    assert reasoning_from_row({"answer": "7", "solution": "sol", "rg_entry": json.dumps(entry)}) == "sol"
    # an empty / missing solution falls back to rg_entry, then to None
    assert reasoning_from_row({"answer": "7", "solution": None, "rg_entry": json.dumps(entry)}) == "3 + 4 = 7"
    assert reasoning_from_row({"answer": "7", "solution": "  "}) is None
    assert reasoning_from_row({"answer": "7", "rg_entry": json.dumps({"metadata": {"x": 1}})}) is None
    # gsm_symbolic entries carry a rationale ending in "#### answer"
    cot = {"metadata": {"answer_cot": "35 x 3 = 105\n#### 105"}}
    assert format_target("105", reasoning_from_row({"answer": "105", "rg_entry": json.dumps(cot)})) == (
        "<reasoning>\n35 x 3 = 105\n</reasoning>\n<answer>\n105\n</answer>"
    )
    with pytest.raises(ValueError, match="rg_entry"):
        reasoning_from_row({"answer": "7", "rg_entry": "{not json"})


# --------------------------------------------------------------------------------------------
# build_sft_dataset
# --------------------------------------------------------------------------------------------


def test_build_sft_dataset_conversational_and_standard_golden():
    messages = make_prompt("What is 3 + 4?")  # the paper template: system + user
    rows = datasets.Dataset.from_list(
        [
            {"prompt": messages, "answer": "7", "solution": "3 + 4 = 7"},
            {"prompt": messages, "answer": "9", "solution": None},
        ]
    )
    out = build_sft_dataset(rows)
    assert out.column_names == ["prompt", "completion"] and len(out) == 2
    assert out[0]["prompt"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "What is 3 + 4?"},
    ]
    assert out[0]["completion"] == [
        {"role": "assistant", "content": "<reasoning>\n3 + 4 = 7\n</reasoning>\n<answer>\n7\n</answer>"}
    ]
    generic = GENERIC_REASONING.format(answer="9")
    assert out[1]["completion"][0]["content"] == f"<reasoning>\n{generic}\n</reasoning>\n<answer>\n9\n</answer>"

    plain = datasets.Dataset.from_list(
        [
            {"prompt": "Question: What is 3 + 4?\nAnswer:", "answer": "7", "solution": "3 + 4 = 7"},
            {"prompt": "Q: 1 + 1?\n", "answer": "2", "solution": "1 + 1 = 2"},
        ]
    )
    out = build_sft_dataset(plain)
    assert out[0] == {
        "prompt": "Question: What is 3 + 4?\nAnswer:",
        "completion": "\n<reasoning>\n3 + 4 = 7\n</reasoning>\n<answer>\n7\n</answer>",
    }
    # a prompt already ending in whitespace gets no extra separator
    assert out[1]["completion"] == "<reasoning>\n1 + 1 = 2\n</reasoning>\n<answer>\n2\n</answer>"


def test_build_sft_dataset_gsm8k_fixture():
    rows = load_task("gsm8k", split="train", path=FIXTURES / "gsm8k")
    out = build_sft_dataset(rows)
    assert len(out) == len(rows)
    assert out[0]["prompt"] == rows[0]["prompt"]
    assert out[0]["completion"][0]["content"] == (
        f"<reasoning>\n{GSM8K_CLEAN}\n</reasoning>\n<answer>\n72\n</answer>"
    )


def test_build_sft_dataset_reasoning_gym_arithmetic():
    rows = load_task(
        "basic_arithmetic", split="train", size=5, seed=3,
        min_terms=2, max_terms=2, min_digits=1, max_digits=2, operators=["+", "-"],
    )
    out = build_sft_dataset(rows)
    for row, example in zip(rows, out):
        expression = json.loads(row["rg_entry"])["metadata"]["expression"]
        assert eval(expression) == int(row["answer"])  # only ints, + and -: the result is the answer
        assert example["completion"][0]["content"] == (
            f"<reasoning>\n{expression} = {row['answer']}\n</reasoning>\n<answer>\n{row['answer']}\n</answer>"
        )


def test_build_sft_dataset_errors():
    with pytest.raises(ValueError, match="empty"):
        build_sft_dataset(datasets.Dataset.from_dict({"prompt": [], "answer": []}))
    with pytest.raises(ValueError, match="'prompt'"):
        build_sft_dataset(datasets.Dataset.from_dict({"question": ["q"], "answer": ["1"]}))
    with pytest.raises(ValueError, match="'answer'"):
        build_sft_dataset(datasets.Dataset.from_dict({"prompt": ["q"], "solution": ["s"]}))
    with pytest.raises(ValueError, match="row 1.*answer"):
        build_sft_dataset(datasets.Dataset.from_dict({"prompt": ["q", "q"], "answer": ["1", " "]}))
    with pytest.raises(ValueError, match="row 0.*prompt"):
        build_sft_dataset(datasets.Dataset.from_dict({"prompt": [""], "answer": ["1"]}))
    with pytest.raises(ValueError, match="datasets.Dataset"):
        build_sft_dataset([{"prompt": "q", "answer": "1"}])


# --------------------------------------------------------------------------------------------
# Completion-only loss: what TRL trains on
# --------------------------------------------------------------------------------------------


def test_collated_batch_masks_the_prompt(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    rows = datasets.Dataset.from_list(
        [
            {"prompt": make_prompt("What is 3 + 4?", template="none"), "answer": "7", "solution": "3 + 4 = 7"},
            {"prompt": make_prompt("What is 12 + 30?"), "answer": "42", "solution": "12 + 30 = 42"},
        ]
    )
    trainer = build_sft_trainer(model, tok, rows, output_dir=str(tmp_path), max_steps=1, batch_size=2)
    batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])
    ids, labels, attention = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape == labels.shape == attention.shape and ids.shape[0] == 2
    for i, row in enumerate(rows):
        n = int(attention[i].sum())
        prompt_text = tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        target = format_target(row["answer"], row["solution"])
        trained = labels[i][labels[i] != -100].tolist()
        masked = (labels[i][:n] == -100).nonzero().flatten()
        # the prompt (chat template + generation prompt) is exactly the masked prefix ...
        assert masked.tolist() == list(range(len(masked)))
        assert tok.decode(ids[i][: len(masked)]) == prompt_text
        # ... and the loss is on the completion: the target and the end-of-turn "<|im_end|>\n" (ChatML)
        assert tok.decode(trained) == target + "<|im_end|>\n"
        assert trained == ids[i][len(masked) : n].tolist()
        # padding (right) is masked too
        assert (labels[i][n:] == -100).all()
    assert int(attention[0].sum()) != int(attention[1].sum())  # the system prompt makes row 1 longer


def test_collated_batch_standard_prompt(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    rows = datasets.Dataset.from_list(
        [{"prompt": "Question: What is 3 + 4?\nAnswer:", "answer": "7", "solution": "3 + 4 = 7"}]
    )
    trainer = build_sft_trainer(model, tok, rows, output_dir=str(tmp_path), max_steps=1, batch_size=1)
    batch = trainer.data_collator([trainer.train_dataset[0]])
    labels = batch["labels"][0]
    # TRL appends the EOS token to a standard completion
    assert tok.decode(labels[labels != -100]) == "\n" + format_target("7", "3 + 4 = 7") + "<|im_end|>"
    assert tok.decode(batch["input_ids"][0][labels == -100]) == "Question: What is 3 + 4?\nAnswer:"


# --------------------------------------------------------------------------------------------
# A real SFT run: loss falls, the model learns the format, the output directory loads
# --------------------------------------------------------------------------------------------

PAIRS = [(3, 4), (12, 5), (7, 30), (41, 2)]
SFT_STEPS = 40


def _train_rows():
    return datasets.Dataset.from_list(
        [
            {
                "prompt": make_prompt(f"What is {a} + {b}?", template="none"),
                "answer": str(a + b),
                "rg_entry": json.dumps({"metadata": {"expression": f"{a} + {b}"}}),
            }
            for a, b in PAIRS
        ]
    )


def _completion_logprob(model, tok, messages, completion: str) -> float:
    """Sum of log p(completion tokens | prompt) under ``model`` (the chat template's rendering)."""
    prompt_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]
    full = tok.apply_chat_template(
        messages + [{"role": "assistant", "content": completion}], tokenize=True, return_dict=True
    )["input_ids"]
    assert full[: len(prompt_ids)] == prompt_ids
    ids = torch.tensor([full])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)  # (T-1, V)
    targets = ids[0, 1:]  # (T-1,)
    token_logp = logp.gather(1, targets[:, None])[:, 0]
    return float(token_logp[len(prompt_ids) - 1 :].sum())


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """Full fine-tuning of a 1.3M-parameter random Llama on 4 prompt -> target pairs.

    Memorisation: batch = all 4 pairs, AdamW lr 3e-3 with a cosine decay over 40 steps. A
    smaller (0.1-0.8M) model or fewer steps did not reliably write the full format greedily.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gtpo.testing import build_tiny_model

    base = build_tiny_model(tmp_path_factory.mktemp("sft-base"), hidden_size=256, num_layers=2, seed=0)
    model = AutoModelForCausalLM.from_pretrained(base)
    tok = AutoTokenizer.from_pretrained(base)
    out = tmp_path_factory.mktemp("sft-out")
    result = run_sft(
        model, tok, _train_rows(), output_dir=str(out), max_steps=SFT_STEPS, learning_rate=3e-3,
        batch_size=4, lr_scheduler_type="cosine", seed=0,
    )
    return {"base": base, "out": result, "model": model, "tok": tok}


def _metrics(out):
    with open(os.path.join(out, METRICS_FILE), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_sft_metrics_file_and_loss_decrease(sft_run):
    rows = _metrics(sft_run["out"])
    assert [r["step"] for r in rows] == list(range(1, SFT_STEPS + 1))
    assert all(list(r)[:3] == ["step", "loss", "learning_rate"] for r in rows)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    # random init: the first loss is close to ln(vocab) (uniform predictions), ln 515 = 6.244
    vocab = len(sft_run["tok"])
    assert abs(rows[0]["loss"] - math.log(vocab)) < 0.3
    # memorised: measured 6.26 -> 0.34 on the 2-core CPU
    assert rows[-1]["loss"] < 1.0
    # mean of the last 5 steps / mean of the first 5: measured 0.34 / 4.21 = 0.08
    assert sum(r["loss"] for r in rows[-5:]) / 5 < 0.2 * sum(r["loss"] for r in rows[:5]) / 5
    # the logged lr follows the cosine schedule: lr_s = 3e-3 * (1 + cos(pi * (s - 1) / 40)) / 2
    for r in rows:
        expected = 3e-3 * 0.5 * (1 + math.cos(math.pi * (r["step"] - 1) / SFT_STEPS))
        assert r["learning_rate"] == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_sft_model_writes_the_format(sft_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = sft_run["out"]
    assert not os.path.exists(os.path.join(out, "adapter_config.json"))
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(sft_run["base"])
    for row in _train_rows():
        text = tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        enc = tok(text, return_tensors="pt", add_special_tokens=False)
        generated = model.generate(**enc, max_new_tokens=40, do_sample=False)
        completion = tok.decode(generated[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        # "<reasoning>...</reasoning>" then "<answer>...</answer>" ending the text
        assert paper_format_score(completion) == 10.0, completion
        # the target became far more likely (measured: -156 .. -176 nats before, -7 .. -10 after)
        target = format_target(row["answer"], reasoning_from_row(row))  # "3 + 4 = 7" ...
        before = _completion_logprob(base, tok, row["prompt"], target)
        after = _completion_logprob(model, tok, row["prompt"], target)
        assert after > before + 100.0 and after > -25.0, (before, after)


def test_sft_saved_model_equals_trained_model(sft_run):
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(sft_run["out"])
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        trained = sft_run["model"].cpu()  # the Trainer moves it to the accelerator when there is one
        assert torch.allclose(loaded(ids).logits, trained(ids).logits, atol=1e-5, rtol=0)
        base = AutoModelForCausalLM.from_pretrained(sft_run["base"])
        assert not torch.allclose(loaded(ids).logits, base(ids).logits, atol=1e-2, rtol=0)


def test_lora_sft_is_merged(tiny_model_path, tmp_path):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    out = run_sft(
        model, tok, _train_rows(), output_dir=str(tmp_path / "lora"), max_steps=3, learning_rate=1e-2,
        batch_size=2, peft_config=lora, save_steps=2,
    )
    files = set(os.listdir(out))
    assert {"config.json", "model.safetensors", "tokenizer.json", METRICS_FILE} <= files
    assert not any(name.startswith("adapter_") or name.startswith(".tmp") for name in files)
    loaded = AutoModelForCausalLM.from_pretrained(out)
    state = loaded.state_dict()
    assert set(state) == set(base_state)  # no lora_A / lora_B / base_layer names: merged
    changed = {k for k in state if not torch.equal(state[k], base_state[k])}
    # only the LoRA-targeted projections moved (B starts at 0 and is trained)
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), changed
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():  # the caller's model object is the merged model
        assert torch.allclose(loaded(ids).logits, model.cpu()(ids).logits, atol=1e-5, rtol=0)
    assert [r["step"] for r in _metrics(out)] == [1, 2, 3]
    # save_steps=2: TRL wrote one intermediate checkpoint (the adapter) in its own sub-directory
    assert os.path.isfile(os.path.join(out, "checkpoint-2", "adapter_config.json"))


# --------------------------------------------------------------------------------------------
# run_sft errors (raised before any model work)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, match",
    [
        ({"prompt": [], "answer": []}, "empty"),
        ({"question": ["q"], "answer": ["1"]}, "'prompt'"),
        ({"prompt": ["q"], "solution": ["s"]}, "'answer'"),
    ],
)
def test_run_sft_dataset_errors(tmp_path, data, match):
    with pytest.raises(ValueError, match=match):
        run_sft(object(), object(), datasets.Dataset.from_dict(data), output_dir=str(tmp_path))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_steps": 0}, "max_steps"),
        ({"batch_size": 0}, "batch_size"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"warmup_ratio": 1.0}, "warmup_ratio"),
        ({"save_steps": -1}, "save_steps"),
        ({"max_length": 0}, "max_length"),
    ],
)
def test_run_sft_argument_errors(tmp_path, kwargs, match):
    rows = datasets.Dataset.from_dict({"prompt": ["q"], "answer": ["1"]})
    with pytest.raises(ValueError, match=match):
        run_sft(object(), object(), rows, output_dir=str(tmp_path), **kwargs)


def test_run_sft_needs_a_tokenizer_with_a_model_object(tmp_path):
    rows = datasets.Dataset.from_dict({"prompt": ["q"], "answer": ["1"]})
    with pytest.raises(ValueError, match="tokenizer"):
        run_sft(object(), None, rows, output_dir=str(tmp_path))
