"""Tests of gtpo.rewards: the paper's reward (golden values and equality with the reference
code), math-verify correctness, format rewards, reasoning-gym scoring, answer extraction and
reward-spec resolution."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtpo import rewards as R
from gtpo.rewards import (
    REWARD_FUNCTIONS,
    answers_equivalent,
    completion_text,
    correctness_reward,
    extract_answer,
    extract_boxed_answer,
    extract_final_answer,
    extract_last_number,
    format_reward,
    format_soft_reward,
    last_number_correctness_reward,
    paper_format_score,
    paper_reward,
    paper_reward_normalized,
    paper_score,
    reasoning_gym_reward,
    resolve_reward,
)

# ----------------------------------------------------------------------------------------
# The reference code, transcribed verbatim (reward_math.py of github.com/winstonsmith1897/GTPO,
# minus its prints and wandb logging) -- the "slow obvious reference" for paper_reward.
# ----------------------------------------------------------------------------------------


def _ref_extract_answer(text):
    match = re.search(r"<answer>\s*(.*?)\s*</answer>$", text, re.DOTALL)
    return match.group(1).strip() if match else None


def _ref_compute_format_reward(text):
    has_reasoning = bool(re.search(r"<reasoning>.*?</reasoning>", text, re.DOTALL))
    has_answer = bool(re.search(r"<answer>.*?</answer>$", text, re.DOTALL))
    if has_reasoning and has_answer:
        return 10.0
    correct_a, correct_r = 0, 0
    if has_reasoning:
        partial_tags = any(re.search(tag, text) for tag in [r"<answer>", r"</answer>"])
        correct_r = 1.5 if partial_tags else 1.0
    if has_answer:
        partial_tags = any(re.search(tag, text) for tag in [r"<reasoning>", r"</reasoning>"])
        correct_a = 1.5 if partial_tags else 1.0
    return correct_r + correct_a


def _ref_compute_correctness_reward(pred, true):
    pred_answer = _ref_extract_answer(pred)
    true_answer = _ref_extract_answer(true)
    if pred_answer is not None and true_answer is not None:
        try:
            pred_val = float(pred_answer)
            true_val = float(true_answer)
            if np.isclose(pred_val, true_val, atol=1e-2):
                return 10.0
            elif str(true_answer) in str(pred_answer):
                return 10.0
        except Exception:
            if str(true_answer) in str(pred_answer):
                return 10.0
    return 0.0


def _ref_final_reward(completion_text_, gold):
    # The reference's `answer` column held "<reasoning>...</reasoning>\n<answer>{gold}</answer>".
    reference = f"<reasoning>\nworked solution\n</reasoning>\n<answer>{gold}</answer>"
    fmt = _ref_compute_format_reward(completion_text_)
    correct = 0 if fmt < 10 else _ref_compute_correctness_reward(completion_text_, reference)
    return fmt + correct


FULL = "<reasoning>\n2 + 2 = 4\n</reasoning>\n<answer>\n{}\n</answer>"


# ---- paper reward: golden values (format score + correctness, worked out by hand) ----------
@pytest.mark.parametrize(
    "text, gold, expected",
    [
        # both blocks, answer block ends the text: format 10; "4" == "4": +10
        (FULL.format(4), "4", 20.0),
        # one trailing newline is allowed by the reference's `$`
        (FULL.format(4) + "\n", "4", 20.0),
        # two trailing newlines: the answer block no longer ends the text -> reasoning block
        # only, and an <answer> tag is present ("partial") -> 1.5; correctness not checked
        (FULL.format(4) + "\n\n", "4", 1.5),
        # full format, wrong answer: 10 + 0
        (FULL.format(4), "5", 10.0),
        # text after </answer>: reasoning block with partial answer tags -> 1.5
        ("<reasoning>r</reasoning><answer>4</answer> done", "4", 1.5),
        # reasoning block alone, no answer tags -> 1.0
        ("<reasoning>r</reasoning> so the answer is 4", "4", 1.0),
        # answer block alone, ending the text, no reasoning tags -> 1.0 (never + correctness)
        ("The answer: <answer>4</answer>", "4", 1.0),
        # ending answer block + an unclosed <reasoning> (partial) -> 1.5
        ("<reasoning> 2+2 is 4 <answer>4</answer>", "4", 1.5),
        # ending answer block + a stray </reasoning> before any <reasoning> -> 1.5
        ("</reasoning> oops <reasoning> <answer>4</answer>", "4", 1.5),
        # ending answer block + only a closing </reasoning> (opening tag missing) -> 1.5
        ("2+2 is 4</reasoning>\n<answer>4</answer>", "4", 1.5),
        # nothing -> 0
        ("4", "4", 0.0),
        ("", "4", 0.0),
        # float tolerance: |0.505 - 0.5| = 0.005 <= 0.01 + 1e-5 * 0.5 -> correct
        (FULL.format("0.505"), "0.5", 20.0),
        # |0.49 - 0.5| = 0.01 <= 0.010005 -> correct (the tolerance edge)
        (FULL.format("0.49"), "0.5", 20.0),
        # |0.48 - 0.5| = 0.02 > 0.010005 and "0.5" not in "0.48" -> wrong
        (FULL.format("0.48"), "0.5", 10.0),
        # not close, but the gold string is contained ("0.5" in "0.52"): the reference counts it
        (FULL.format("0.52"), "0.5", 20.0),
        # gold contained in a non-numeric answer
        (FULL.format("x = 5 apples"), "5", 20.0),
        # the reference's containment quirk: "5" in "15" scores as correct
        (FULL.format("15"), "5", 20.0),
        # integer formatting: float("4.0") == float("4")
        (FULL.format("4.0"), "4", 20.0),
        # LaTeX gold: float() fails, string containment decides
        (FULL.format("\\frac{1}{2}"), "\\frac{1}{2}", 20.0),
        (FULL.format("0.5"), "\\frac{1}{2}", 10.0),
        # thousands separator: float("1,000") fails and "1000" is not in "1,000"
        (FULL.format("1,000"), "1000", 10.0),
        # two answer blocks: the reference regex spans "3</answer>\n<answer>4"; "4" contained
        ("<reasoning>r</reasoning><answer>3</answer>\n<answer>4</answer>", "4", 20.0),
        ("<reasoning>r</reasoning><answer>3</answer>\n<answer>4</answer>", "7", 10.0),
    ],
)
def test_paper_score_golden(text, gold, expected):
    assert paper_score(text, gold) == expected
    assert _ref_final_reward(text, gold) == expected  # our reading of the reference holds


def test_paper_format_score_values():
    assert paper_format_score(FULL.format(1)) == 10.0
    assert paper_format_score("<reasoning>x</reasoning>") == 1.0
    assert paper_format_score("<reasoning>x</reasoning> </answer>") == 1.5
    assert paper_format_score("<answer>x</answer>") == 1.0
    assert paper_format_score("<reasoning><answer>x</answer>") == 1.5
    assert paper_format_score("<answer>x") == 0.0


_FRAGMENTS = [
    "<reasoning>", "</reasoning>", "<answer>", "</answer>", "\n", " ", "4", "0.5", "0.505",
    "1,000", "1000", "15", "-3", "x", "\\frac{1}{2}", "nan", "inf", "1e3",
]


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from(_FRAGMENTS), max_size=12),
    gold=st.sampled_from(["4", "5", "0.5", "1000", "-3", "\\frac{1}{2}", "inf", "1e3"]),
)
def test_paper_score_equals_reference_code(parts, gold):
    """Random tag soups: our port equals the transcribed reference code exactly."""
    text = "".join(parts)
    assert paper_score(text, gold) == _ref_final_reward(text, gold)
    assert paper_score(text, gold) in {0.0, 1.0, 1.5, 10.0, 20.0}


def test_paper_reward_batch_contract():
    completions = [FULL.format(4), FULL.format(3), "no tags", FULL.format(4)]
    answers = ["4", "4", "4", None]
    assert paper_reward(completions=completions, answer=answers) == [20.0, 10.0, 0.0, None]
    assert paper_reward_normalized(completions=completions, answer=answers) == [1.0, 0.5, 0.0, None]
    # conversational completions give the same values
    conv = [[{"role": "assistant", "content": c}] for c in completions]
    assert paper_reward(prompts=["p"] * 4, completions=conv, completion_ids=[[1]] * 4,
                        answer=answers, task=["t"] * 4) == [20.0, 10.0, 0.0, None]


def test_paper_reward_errors():
    with pytest.raises(ValueError, match="'answer'"):
        paper_reward(completions=["x"])
    with pytest.raises(ValueError, match="2 entries but there are 1"):
        paper_reward(completions=["x"], answer=["1", "2"])


# ---- format rewards ---------------------------------------------------------------------
def test_format_rewards_golden():
    texts = [
        FULL.format(4),                                  # full format
        "<reasoning>r</reasoning><answer>4</answer>!",   # answer block does not end the text
        "<answer>4</answer>",                            # two tags once each
        "<answer><answer>",                              # <answer> twice: no credit for it
        "plain text",
    ]
    assert format_reward(completions=texts) == [1.0, 0.0, 0.0, 0.0, 0.0]
    # 0.25 per tag present exactly once: 4, 4, 2, 0, 0 tags
    assert format_soft_reward(completions=texts) == [1.0, 1.0, 0.5, 0.0, 0.0]


# ---- extraction -------------------------------------------------------------------------
def test_completion_text_forms():
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "abc"}]) == "abc"
    assert completion_text({"role": "assistant", "content": "abc"}) == "abc"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]}]) == "ab"
    with pytest.raises(ValueError, match="completions"):
        completion_text(3)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer> 4 </answer>", "4"),
        ("<answer>3</answer> then <answer>4</answer> trailing", "4"),  # last block, need not end
        ("<answer>\n\\frac{1}{2}\n</answer>", "\\frac{1}{2}"),
        ("<answer>4", None),
        ("none", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 18.", "18"),
        ("5 - 3 - 6 = -4", "-4"),
        ("5-3=2", "2"),
        ("x-3", "3"),           # binary minus after a letter
        ("total $1,234.50", "1234.50"),
        ("3/4 of them", "3/4"),
        ("10, 20, 30", "30"),
        ("-.5", "-.5"),
        ("no digits", None),
    ],
)
def test_extract_last_number(text, expected):
    assert extract_last_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),      # nested braces
        ("\\boxed{1} and then \\boxed{2}", "2"),             # last one
        ("\\fbox{9}", "9"),
        ("$\\boxed 5$", "5"),                                # brace-less MATH form
        ("\\boxed{\\{-1, 1\\}}", "\\{-1, 1\\}"),             # escaped braces inside
        ("\\boxed{\\frac{1}{2}", None),                      # unclosed (truncated reply)
        ("nothing", None),
    ],
)
def test_extract_boxed_answer(text, expected):
    assert extract_boxed_answer(text) == expected


def test_extract_final_answer_modes():
    text = "I think \\boxed{3}, or 5"
    assert extract_final_answer(text, "boxed") == "3"
    assert extract_final_answer(text, "last_number") == "5"
    assert extract_final_answer(text, "tag") is None
    assert extract_final_answer(text, "auto") == "3"               # no tag -> boxed
    assert extract_final_answer(text + " <answer>7</answer>", "auto") == "7"
    assert extract_final_answer("only 5 here", "auto") == "5"
    with pytest.raises(ValueError, match="answer_from"):
        extract_final_answer(text, "first")


# ---- math-verify correctness ------------------------------------------------------------
@pytest.mark.parametrize(
    "gold, completion, answer_from, expected",
    [
        ("\\frac{1}{2}", "<answer>0.5</answer>", "tag", 1.0),
        ("0.5", "<answer>1/2</answer>", "tag", 1.0),
        ("1/2", "<answer>\\frac{1}{2}</answer>", "tag", 1.0),
        ("1000", "<answer>1,000</answer>", "tag", 1.0),
        ("3\\sqrt{2}", "<answer>\\sqrt{18}</answer>", "tag", 1.0),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "<answer>(3, \\pi/2)</answer>", "tag", 1.0),
        ("18", "The answer is 18.", "last_number", 1.0),
        ("18", "The answer is 18.", "tag", 0.0),          # no tag
        ("18", "The answer is 18.", "auto", 1.0),         # auto falls back to the last number
        ("\\frac{1}{2}", "so \\boxed{\\dfrac12}", "boxed", 1.0),
        ("3", "<answer>4</answer>", "auto", 0.0),
        ("-4", "5 - 3 - 6 = -4", "last_number", 1.0),
        ("3", "no answer here", "auto", 0.0),
        ("3", "<answer>}{\\frac</answer>", "tag", 0.0),   # unparsable: 0, no exception
        ("B", "<answer>B</answer>", "tag", 1.0),
    ],
)
def test_correctness_reward(gold, completion, answer_from, expected):
    out = correctness_reward(completions=[completion], answer=[gold], answer_from=answer_from)
    assert out == [expected]


def test_correctness_reward_contract():
    conv = [[{"role": "assistant", "content": "<answer>0.5</answer>"}], "<answer>2</answer>", "x"]
    out = correctness_reward(prompts=["p"] * 3, completions=conv, completion_ids=[[0]] * 3,
                             answer=["1/2", "2", None], question=["q"] * 3)
    assert out == [1.0, 1.0, None]
    assert last_number_correctness_reward(completions=["so 7", "so 8"], answer=["7", "7"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="answer_from"):
        correctness_reward(completions=["x"], answer=["1"], answer_from="nope")
    with pytest.raises(ValueError, match="'answer'"):
        correctness_reward(completions=["x"])


def test_correctness_in_worker_thread():
    """math-verify's signal timeouts fail outside the main thread; ours must not."""
    R._parse_cached.cache_clear()  # force real parses inside the worker thread
    comps = ["<answer>\\frac{3}{7}</answer>", "<answer>0.43</answer>"]

    def work():
        assert threading.current_thread() is not threading.main_thread()
        return correctness_reward(completions=comps, answer=["6/14", "6/14"])

    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(work).result() == [1.0, 0.0]


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ("0.5", "\\frac{1}{2}", True),
        ("1/2", "\\frac12", True),
        ("1,000", "1000", True),
        (" 42 ", "42", True),          # fast path after whitespace normalisation
        ("2", "3", False),
        ("x+1", "1+x", True),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("", "", False),
        (None, "1", False),
    ],
)
def test_answers_equivalent(a, b, expected):
    assert answers_equivalent(a, b) is expected
    assert answers_equivalent(b, a) is expected  # symmetric


# ---- reasoning-gym ----------------------------------------------------------------------
def test_reasoning_gym_reward_matches_task_scorer():
    import json

    import reasoning_gym

    from gtpo.data import load_task

    ds = load_task("chain_sum", size=3, seed=0, min_terms=2, max_terms=2)
    rows = ds.to_list()
    golds = [r["answer"] for r in rows]
    completions = [f"<answer>{golds[0]}</answer>", "<answer>999999</answer>", f"so {golds[2]}"]
    cols = {k: [r[k] for r in rows] for k in ("rg_entry", "task", "rg_config", "answer")}
    out = reasoning_gym_reward(completions=completions, **cols)
    direct = reasoning_gym.create_dataset("chain_sum", size=3, seed=0, min_terms=2, max_terms=2)
    expected = [direct.score_answer(a, json.loads(e)) for a, e in
                zip([golds[0], "999999", golds[2]], cols["rg_entry"])]
    assert out == expected == [1.0, 0.0, 1.0]
    # answer_from="tag": the third reply has no tag -> the scorer gets None -> 0
    out_tag = reasoning_gym_reward(completions=completions, answer_from="tag", **cols)
    assert out_tag == [1.0, 0.0, 0.0]


def test_reasoning_gym_reward_missing_entries():
    entry = '{"question": "Calculate 1 + 1.", "answer": "2", "metadata": {"source_dataset": "basic_arithmetic"}}'
    # the task name falls back to metadata.source_dataset; a row without an entry gives None
    assert reasoning_gym_reward(completions=["<answer>2</answer>", "x"], rg_entry=[entry, None]) == [1.0, None]
    with pytest.raises(ValueError, match="rg_entry"):
        reasoning_gym_reward(completions=["x"], answer=["1"])


# ---- registry and resolve_reward ---------------------------------------------------------
def test_every_registered_reward_follows_the_contract():
    entry = '{"question": "Calculate 1 + 1.", "answer": "2", "metadata": {"source_dataset": "basic_arithmetic"}}'
    kwargs = dict(
        prompts=[[{"role": "user", "content": "q"}]] * 3,
        completions=[[{"role": "assistant", "content": c}] for c in
                     [FULL.format(2), "<answer>3</answer>", "2"]],
        completion_ids=[[1, 2], [3], [4]],
        answer=["2"] * 3, question=["q"] * 3, task=["basic_arithmetic"] * 3,
        rg_entry=[entry] * 3,
    )
    assert set(REWARD_FUNCTIONS) == {
        "paper", "paper_normalized", "correctness", "format", "format_soft", "reasoning_gym",
        "last_number_correctness",
    }
    for name, func in REWARD_FUNCTIONS.items():
        out = func(**kwargs)
        assert len(out) == 3, name
        assert all(isinstance(v, float) for v in out), name


def test_resolve_reward_specs(tmp_path):
    assert resolve_reward("paper") is paper_reward
    assert resolve_reward(" format ") is format_reward

    def mine(**kw):
        return [0.0]

    assert resolve_reward(mine) is mine
    assert resolve_reward("gtpo.rewards:format_soft_reward") is format_soft_reward
    file = tmp_path / "my_reward.py"
    file.write_text("def length_reward(completions, **kw):\n    return [float(len(c)) for c in completions]\n")
    func = resolve_reward(f"{file}:length_reward")
    assert func(completions=["ab", "c"]) == [2.0, 1.0]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", r"unknown reward name; built-in rewards are \['correctness', 'format'"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("gtpo.rewards:no_such_function", "has no attribute 'no_such_function'"),
        ("gtpo.rewards:ANSWER_FROM", "is not callable"),
        ("missing_dir/missing.py:f", "does not exist"),
        (123, "expected a built-in name"),
        ("", "expected a built-in name"),
    ],
)
def test_resolve_reward_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_reward(spec)


def test_resolve_reward_file_with_import_error(tmp_path):
    file = tmp_path / "broken.py"
    file.write_text("import no_such_module_xyz\n")
    with pytest.raises(ValueError, match="importing .*broken.py.* failed"):
        resolve_reward(f"{file}:f")
