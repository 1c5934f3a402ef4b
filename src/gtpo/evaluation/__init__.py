"""Evaluation: pass@k, maj@k, format rate, completion length, MMLU (``gtpo eval``).

One job per module:

* ``estimators`` -- pass@k (Chen et al. 2021, unbiased) and maj@k (exact expectation over
  subsets, or the first k samples), answer classes, k lists: pure functions, no torch.
* ``scoring`` -- judging completions (math-verify, reasoning-gym scorers, reward functions) and
  the dataset metrics from judged samples; no model.
* ``mmlu`` -- MMLU accuracy from the log-likelihood of the answer letter.
* ``options`` -- :class:`EvalOptions`, the settings of one evaluation (what ``gtpo eval`` fills), and
  :class:`ScoringOptions`, how the trainer's evaluation judges and counts its samples.
* ``api`` -- :func:`evaluate` (load, sample, score, write the results JSON), :func:`rescore`
  (recompute from a results file), :func:`evaluate_during_training` (the trainer's
  ``eval_steps``), :func:`format_table`.

The command line (``gtpo eval``) is in ``gtpo.cli`` (it only parses arguments into an :class:`EvalOptions`). The public names of the modules are
importable from here; ``gtpo.evaluate`` is :func:`gtpo.evaluation.api.evaluate`. Importing this
package imports neither torch nor transformers (the functions that need them import them).
"""

from __future__ import annotations

from .api import evaluate, evaluate_during_training, format_table, generate_samples, rescore, seeded, write_results
from .estimators import (
    MAJ_ESTIMATORS,
    UNPARSABLE_MODES,
    default_k_list,
    group_answers,
    maj_at_k,
    majority_vote_score,
    parse_k_list,
    pass_at_k,
)
from .options import EvalOptions, ScoringOptions
from .mmlu import continuation_logprobs, evaluate_mmlu, mmlu_metrics, mmlu_prompt, mmlu_stem
from .scoring import CORRECT_SCORE, aggregate_metrics, score_problems, score_samples

__all__ = [
    "pass_at_k",
    "maj_at_k",
    "group_answers",
    "majority_vote_score",
    "default_k_list",
    "parse_k_list",
    "MAJ_ESTIMATORS",
    "UNPARSABLE_MODES",
    "CORRECT_SCORE",
    "score_samples",
    "score_problems",
    "aggregate_metrics",
    "EvalOptions",
    "ScoringOptions",
    "evaluate",
    "generate_samples",
    "seeded",
    "rescore",
    "evaluate_during_training",
    "format_table",
    "write_results",
    "evaluate_mmlu",
    "mmlu_prompt",
    "mmlu_stem",
    "mmlu_metrics",
    "continuation_logprobs",
]
