"""The settings of one evaluation (:class:`EvalOptions`): what ``gtpo eval`` fills from its arguments and
:func:`gtpo.evaluation.evaluate` takes. Checked once, when built; no torch here. :class:`ScoringOptions`: how the
trainer's evaluation (:func:`gtpo.evaluation.evaluate_during_training`) judges and counts its samples."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable

from .estimators import (MAJ_ESTIMATOR_DOC, MAJ_ESTIMATORS, PASS_AT_K_ESTIMATOR, UNPARSABLE_DOC, UNPARSABLE_MODES,
                         as_count, parse_k_list)
from .scoring import CORRECT_SCORE

__all__ = ["BACKENDS", "EvalOptions", "ScoringOptions", "check_choice", "estimator_settings"]

#: samplers of :func:`gtpo.evaluation.evaluate` (``backend=``)
BACKENDS = ("hf", "vllm")


def check_choice(value: Any, choices, name: str) -> None:
    """A ValueError naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")


def estimator_settings(maj_estimator: str, unparsable: str) -> dict:
    """The estimator and scoring rules recorded in the results' ``settings``."""
    return {
        "pass_estimator": PASS_AT_K_ESTIMATOR,
        "maj_estimator": maj_estimator,
        "maj_estimator_rule": MAJ_ESTIMATOR_DOC[maj_estimator],
        "unparsable": unparsable,
        "unparsable_rule": UNPARSABLE_DOC[unparsable],
        "correct_rule": "math-verify equivalence of the extracted answer with the gold answer; "
        "reasoning-gym tasks: the task's scorer gives full marks (1.0)",
    }


@dataclass(frozen=True)
class ScoringOptions:
    """How :func:`gtpo.evaluation.evaluate_during_training` judges each sample and counts the votes (the arguments
    of :func:`gtpo.evaluation.scoring.score_problems` that are not the samples themselves).

    ``reward_fn``: an optional correctness reward (TRL's contract, called with the row's columns and
    ``completion_ids``; or a ``gtpo.rewards.resolve_reward`` spec); None: the reasoning-gym scorer for rows with
    ``rg_entry``, else math-verify against ``answer``. A sample counts as correct when its score is
    ``>= correct_threshold`` (default 1.0: use a correctness reward, or set the threshold, e.g. 20 for the paper's
    [0, 20] reward). ``answer_from``: where answers are read (``gtpo.rewards.extract_final_answer``);
    ``maj_estimator``, ``unparsable``: see ``gtpo.evaluation.estimators``.
    """

    reward_fn: Callable[..., list] | str | None = None
    correct_threshold: float = CORRECT_SCORE
    answer_from: str = "auto"
    maj_estimator: str = "expected"
    unparsable: str = "abstain"


@dataclass(frozen=True)
class EvalOptions:
    """What to evaluate and how (every field is also a keyword of :func:`gtpo.evaluation.evaluate`).

    Data: ``dataset`` (a task name of ``gtpo.data.load_task`` -- ``gsm8k``, ``math``, ``math500``, ``aime24``,
    ``aime25``, ``amc23``, ``mmlu``, ``rg:<task>`` --, a local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file,
    or loaded rows), ``split``, ``template``, ``system_prompt``, ``size``, ``seed`` (subsampling and sampling; the
    caller's RNG state is restored afterwards), ``data_path`` (a local copy of a hub dataset), ``columns`` (a
    mapping for local files), ``task_kwargs``.
    Sampling: ``n`` completions per problem, ``temperature`` (0: greedy, only with ``n=1``), ``top_p``, ``top_k``,
    ``max_new_tokens``, ``max_prompt_length``, ``batch_size`` (completions per generate call), ``backend``
    (``"hf"``: gtpo's decoding loop / transformers ``generate``; ``"vllm"``: a vLLM engine) and ``backend_args``
    (vLLM engine settings, ``backend="vllm"`` only).
    Scoring: ``k`` and ``maj_k`` (lists, an int, a ``"1,8,16"`` string, or None: 1, 8, 16, ... up to ``n``; each
    ``<= n``), ``maj_estimator`` (``"expected"`` / ``"first"``), ``unparsable`` (``"abstain"`` / ``"vote"``),
    ``answer_from`` (``"auto"``, ``"tag"``, ``"boxed"``, ``"last_number"``), ``mmlu_chat_template``.
    Model: ``adapter`` (a peft adapter directory), ``dtype``, ``device``. Output: ``out`` (results JSON, written
    atomically), ``progress`` (a bar on stderr).

    Raises ValueError naming the field: ``k > n``, greedy with ``n > 1``, an unknown choice, ...
    """

    dataset: Any = "gsm8k"
    adapter: str | None = None
    n: int = 64
    k: Any = None
    maj_k: Any = None
    maj_estimator: str = "expected"
    unparsable: str = "abstain"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 1024
    max_prompt_length: int | None = None
    batch_size: int | None = 64
    answer_from: str = "auto"
    out: str | os.PathLike | None = None
    split: str = "test"
    template: str = "paper"
    system_prompt: str | None = None
    size: int | None = None
    seed: int = 0
    data_path: str | None = None
    columns: dict | None = None
    task_kwargs: dict | None = None
    dtype: Any = None
    device: Any = None
    mmlu_chat_template: bool = False
    progress: bool = False
    backend: str = "hf"
    backend_args: dict | None = None

    def __post_init__(self) -> None:
        from ..rewards import ANSWER_FROM

        n = as_count(self.n, "n")
        if n == 0:
            raise ValueError("n (completions per problem) must be >= 1, got 0")
        object.__setattr__(self, "n", n)
        self.ks()  # k and maj_k must be <= n
        check_choice(self.maj_estimator, MAJ_ESTIMATORS, "maj_estimator")
        check_choice(self.unparsable, UNPARSABLE_MODES, "unparsable")
        check_choice(self.answer_from, ANSWER_FROM, "answer_from")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.temperature == 0 and n > 1:
            raise ValueError(f"temperature=0 decodes greedily and gives n={n} identical samples; "
                             "use n=1 for greedy accuracy or a temperature > 0 for pass@k")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check_choice(self.backend, BACKENDS, "backend")
        if self.backend_args is not None and (self.backend != "vllm" or not isinstance(self.backend_args, dict)):
            raise ValueError("backend_args: a mapping of vLLM engine settings, with backend='vllm' only; got "
                             f"{self.backend_args!r} with backend={self.backend!r}")

    @classmethod
    def with_fields(cls, base: "EvalOptions | None" = None, **fields: Any) -> "EvalOptions":
        """``base`` (default: the defaults) with ``fields`` replaced; an unknown name is a ValueError naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
            raise ValueError(f"{unknown[0]}: not an evaluation setting{'; did you mean ' + repr(close[0]) + '?' if close else ''}")
        return dataclasses.replace(base, **fields) if base is not None else cls(**fields)

    def ks(self) -> tuple[list[int], list[int]]:
        """``(pass@k values, maj@k values)`` resolved against ``n``."""
        ks = parse_k_list(self.k, self.n, "k")
        return ks, (ks if self.maj_k is None else parse_k_list(self.maj_k, self.n, "maj_k"))

    def settings(self) -> dict:
        """The settings recorded in the results JSON of a generated evaluation."""
        ks, maj_ks = self.ks()
        return {
            "n": self.n, "k": ks, "maj_k": maj_ks, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": self.top_k, "max_new_tokens": self.max_new_tokens, "max_prompt_length": self.max_prompt_length,
            "batch_size": self.batch_size, "answer_from": self.answer_from, "split": self.split,
            "template": self.template, "system_prompt": self.system_prompt, "size": self.size, "seed": self.seed,
            "data_path": self.data_path, "columns": self.columns, "task_kwargs": self.task_kwargs,
            "backend": self.backend, "backend_args": self.backend_args,
            **estimator_settings(self.maj_estimator, self.unparsable),
        }
