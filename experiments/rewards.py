"""Zero-weight diagnostic rewards of the reproduction suite (TRL's reward-function contract).

They are listed in ``reward_funcs`` with weight 0 (``reward_weights: [1, 0, 0]``), so they change
nothing in training but each gets its own ``reward/<name>/mean`` line in ``metrics.jsonl``:

* :func:`paper_accuracy`: 1.0 iff the paper's reward is 20 (full format **and** correct answer), the
  accuracy the paper reports; also the ``eval_reward`` of the held-out evaluation.
* :func:`paper_format`: 1.0 iff the paper's format score is 10 (``gtpo.rewards.format_reward``).

Referenced from the YAML configs as ``experiments/rewards.py:paper_accuracy`` (paths are relative
to the repository root, where the suite runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gtpo.rewards import PAPER_MAX, completion_text, paper_format_score, paper_score


def paper_accuracy(*, completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 where ``gtpo.rewards.paper_score`` is its maximum 20 (format 10 + correct 10), else 0.0.
    ``rewards (B,)``."""
    return [1.0 if paper_score(completion_text(c), str(a)) >= PAPER_MAX else 0.0
            for c, a in zip(completions, answer, strict=True)]


def paper_format(*, completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 where the paper's format score is 10 (reasoning block + answer block ending the text).
    ``rewards (B,)``."""
    return [1.0 if paper_format_score(completion_text(c)) >= 10.0 else 0.0 for c in completions]
