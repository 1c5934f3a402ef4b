"""Fast tests of the tiny task the protocol's models are built on (``pretrain.py``) and of the diagnostic
rewards (``rewards.py``); no training. Collected by a plain ``pytest`` (the project's ``testpaths``: ``tests/`` and
``experiments/``). The first suite's tests moved with it to ``legacy/test_suite.py``."""

from __future__ import annotations

import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import pretrain  # noqa: E402
from rewards import paper_accuracy, paper_format  # noqa: E402


# ------------------------------------------------------------------------------------ the task
def test_problem_golden():
    # random.Random(0).randint(10, 99) = 59, then randint(1, 9) = 7, randint(1, 9) = 1 (hand-checked by the
    # first probe in experiments/configs/tiny.yaml: "Calculate 59 + 7 - 1."); 59 + 7 = 66, 66 - 1 = 65
    p = pretrain.make_problem(random.Random(0))
    assert p["_ops"] == (59, 7, 1)
    assert p["answer"] == "65"
    assert p["solution"] == "59 + 7 = 66\n66 - 1 = 65"
    assert p["question"].endswith("59 + 7 - 1?") or p["question"].endswith("59 + 7 - 1.")


def test_splits_disjoint_and_deterministic():
    pre, train, test = pretrain.make_splits(3)
    test_ops = {p["_ops"] for p in test}
    assert len(test_ops) == pretrain.N_TEST
    assert not test_ops & {p["_ops"] for p in pre}
    assert not test_ops & {p["_ops"] for p in train}
    again = pretrain.make_splits(3)
    assert [p["question"] for p in again[2]] == [p["question"] for p in test]


def test_noisy_completion_scores():
    """Clean targets score 20 with the paper's reward; slips keep the format (10) with a wrong answer;
    broken formats score 1.0 or 1.5; the fractions match P_SLIP and P_BROKEN within sampling noise."""
    from gtpo.rewards import paper_format_score, paper_score

    rng = random.Random(0)
    probs = [pretrain.make_problem(rng) for _ in range(4000)]
    assert all(paper_score(pretrain.clean_completion(p), p["answer"]) == 20.0 for p in probs[:50])
    scores = [paper_score(pretrain.noisy_completion(p, rng), p["answer"]) for p in probs]
    fmt = [paper_format_score(pretrain.noisy_completion(p, random.Random(i))) for i, p in enumerate(probs)]
    assert set(scores) <= {1.0, 1.5, 10.0, 20.0}
    broken = sum(s < 10 for s in scores) / len(scores)
    slips = sum(s == 10.0 for s in scores) / len(scores)
    # binomial std with n = 4000 is ~0.0075 for p = 0.35 and ~0.0035 for p = 0.05: 4 std tolerances
    assert abs(broken - pretrain.P_BROKEN) < 0.03
    assert abs(slips - pretrain.P_SLIP) < 0.015
    assert set(fmt) <= {1.0, 1.5, 10.0}


def test_diagnostic_rewards():
    good = "<reasoning>\n59 + 7 = 66\n66 - 1 = 65\n</reasoning>\n<answer>\n65\n</answer>"
    wrong = good.replace("65\n</answer>", "64\n</answer>")
    broken = "59 + 7 = 66\n<answer>\n65\n</answer>"
    comps = [good, wrong, broken]
    assert paper_accuracy(completions=comps, answer=["65"] * 3) == [1.0, 0.0, 0.0]
    assert paper_format(completions=comps) == [1.0, 1.0, 0.0]
    conversational = [[{"role": "assistant", "content": good}]]
    assert paper_accuracy(completions=conversational, answer=["65"]) == [1.0]
