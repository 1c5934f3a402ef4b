"""Math reasoning datasets, prompt templates and the normalised example format.

One entry point, :func:`load_task`, returns a ``datasets.Dataset`` whose rows have

* ``prompt``: a string (standard prompt) or a list of chat messages
  ``[{"role": "system", ...}, {"role": "user", ...}]`` (conversational; the trainer applies
  the tokenizer's chat template), built by :func:`make_prompt`;
* ``question``: the raw question text; ``answer``: the gold final answer (a string);
* ``task``: the task name; optionally ``solution`` (worked reasoning, for SFT warm-up);
* task-specific extras: reasoning-gym rows carry ``rg_entry`` (the generated entry as JSON,
  for the task's scorer) and ``rg_config`` (the task config as JSON); MMLU rows keep
  ``stem`` (the bare question), ``choices`` and ``subject`` as data (``answer`` is the letter;
  ``question`` adds the ``A. ...`` choice lines and an instruction, for generation); MATH rows
  keep ``level`` and ``type``; MATH-500 rows keep ``level``, ``subject`` and ``unique_id``.

Every extra column reaches the reward functions as a keyword argument (TRL's contract).

Sources (``HUB_IDS``; reference facts from the paper's setup, docs/gtpo-method.md §7):

==========  ==============================  ==========  ===================  ====================
name        hub id                          config(s)   splits               gold answer
==========  ==============================  ==========  ===================  ====================
gsm8k       openai/gsm8k                    main        train, test          after ``####``
math        EleutherAI/hendrycks_math       7 subjects  train, test          last ``\\boxed{}``
math500     HuggingFaceH4/MATH-500          -           test                 ``answer``
aime24      HuggingFaceH4/aime_2024         -           train (test alias)   ``answer``
aime25      yentinglin/aime_2025            -           train (test alias)   ``answer``
amc23       math-ai/amc23                   -           test                 ``answer``
mmlu        cais/mmlu                       all         test, validation,    letter of ``answer``
                                                        dev, auxiliary_train
==========  ==============================  ==========  ===================  ====================

AIME 2025: ``yentinglin/aime_2025`` (30 problems, columns ``problem``/``answer``, one split
``train``) is the copy used next to ``HuggingFaceH4/aime_2024`` by open-r1/lighteval-style
evaluations; ``opencompass/AIME2025`` (two configs) holds the same problems. The benchmark
sets with a single hub split ``train`` also answer to ``split="test"``.

Offline use: every hub loader takes ``path=``, a local copy in the hub's own format that
replaces the hub id, so the parsing code is the same: a directory laid out like the hub
repository (e.g. ``gsm8k/main/train-00000-of-00001.parquet``; per-config sub-directories
are used when present) or a single file (parquet/jsonl/json/csv) holding the requested
split. The tests run every loader on such fixtures (tests/fixtures/data).

Procedural tasks come from reasoning-gym (``"rg:<task>"`` or a bare task name such as
``"basic_arithmetic"``), generated offline; ``"train"`` and ``"test"`` are disjoint by
construction (see :func:`load_task`).

No torch import here; ``datasets`` and ``reasoning_gym`` are imported inside functions.

The package's parts: :mod:`gtpo.data.templates` (prompts), :mod:`gtpo.data.sources` (hub ids, per-task
processors, reasoning-gym) and :mod:`gtpo.data.loaders` (:func:`load_task`); this module re-exports their public names.
"""

from __future__ import annotations

from ..rewards import extract_boxed_answer as last_boxed  # the same function under data's old name
from .templates import (
    SYSTEM_PROMPT,
    FORMAT_SYSTEM_PROMPT,
    ANSWER_ONLY_SYSTEM_PROMPT,
    TEMPLATES,
    make_prompt,
    format_paper_completion,
)
from .sources import (
    HubSource,
    HUB_IDS,
    MATH_SUBJECTS,
    REASONING_GYM_EXAMPLES,
    KNOWN_TASKS,
    RG_TEST_FRACTION,
    MMLU_LETTERS,
    mmlu_choice_lines,
    extract_gsm8k_answer,
)
from .loaders import FILE_EXTENSIONS, load_task

__all__ = [
    "SYSTEM_PROMPT",
    "FORMAT_SYSTEM_PROMPT",
    "ANSWER_ONLY_SYSTEM_PROMPT",
    "TEMPLATES",
    "HubSource",
    "HUB_IDS",
    "MATH_SUBJECTS",
    "REASONING_GYM_EXAMPLES",
    "KNOWN_TASKS",
    "FILE_EXTENSIONS",
    "RG_TEST_FRACTION",
    "MMLU_LETTERS",
    "make_prompt",
    "mmlu_choice_lines",
    "format_paper_completion",
    "extract_gsm8k_answer",
    "last_boxed",
    "load_task",
]
