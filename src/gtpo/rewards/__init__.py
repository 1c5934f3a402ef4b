"""Reward functions for math reasoning (TRL's reward-function contract).

Contract (the same as TRL's ``GRPOTrainer``): a reward function is called with keyword
arguments only::

    f(prompts=..., completions=..., completion_ids=..., **dataset_columns) -> list[float | None]

where every argument is a list of length ``B`` (one entry per completion) and the dataset
columns (``answer``, ``rg_entry``, ``task``, ...) are repeated for each completion of a prompt.
``completions`` holds strings for standard prompts, or for conversational prompts a list of
messages per completion (``[{"role": "assistant", "content": text}]``); both are accepted.
``None`` in the returned list means "this reward does not apply to this row" (here: the row
has no gold answer / no reasoning-gym entry); the trainer must ignore it (TRL uses nansum).

Built-in rewards (``REWARD_FUNCTIONS``):

* ``paper``: the GTPO paper's reward in [0, 20] (format 10 + correctness 10), a line-by-line
  port of the reference code's ``reward_math.py`` (:func:`paper_reward`);
* ``paper_normalized``: ``paper`` / 20, in [0, 1];
* ``correctness``: 1.0 / 0.0 via math-verify on the extracted answer (``answer_from``);
* ``last_number_correctness``: correctness reading the last number of the reply (the CPU
  demo: SmolLM2-135M never writes ``<answer>`` tags);
* ``format``: 1.0 iff the paper's full format holds (format score 10), else 0.0;
* ``format_soft``: 0.25 per tag (``<reasoning>``, ``</reasoning>``, ``<answer>``,
  ``</answer>``) that appears exactly once: a dense shaping signal;
* ``reasoning_gym``: the reasoning-gym task's own scorer on the extracted answer.

math-verify notes: ``parse``/``verify`` protect themselves with ``signal.alarm`` timeouts,
which raise outside the main thread. :func:`_math_verify_timeout` passes the timeout only in
the main thread and ``None`` elsewhere (trainer worker threads, some test runners), so these
functions work everywhere. Parses are cached (gold answers repeat G times per prompt).

No torch import here: this module must stay importable by the CLI and data tools cheaply.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import re
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = [
    "REWARD_FUNCTIONS",
    "ANSWER_FROM",
    "completion_text",
    "extract_answer",
    "extract_last_number",
    "extract_boxed_answer",
    "extract_final_answer",
    "paper_format_score",
    "paper_correctness_score",
    "paper_score",
    "paper_reward",
    "paper_reward_normalized",
    "correctness_reward",
    "last_number_correctness_reward",
    "format_reward",
    "format_soft_reward",
    "reasoning_gym_reward",
    "answers_equivalent",
    "resolve_reward",
]

#: Where :func:`extract_final_answer` reads the answer from (see its docstring).
ANSWER_FROM = ("tag", "boxed", "last_number", "auto")

#: Seconds allowed to one math-verify parse / comparison when running in the main thread.
MATH_VERIFY_TIMEOUT_S = 5

# ---------------------------------------------------------------------------------------
# Completion text and answer extraction
# ---------------------------------------------------------------------------------------


def completion_text(completion: Any) -> str:
    """The text of one completion, standard or conversational.

    Accepts a string (standard prompts), a message dict ``{"role", "content"}``, or a list of
    messages (TRL's conversational completions, ``[{"role": "assistant", "content": text}]``);
    the contents of its messages are concatenated, but those of tool messages (``role`` 'tool': a
    multi-turn completion's tool results are the environment's words, not the model's, so a tool's
    output never counts as the model's answer). A message ``content`` given as a list of parts
    (``[{"type": "text", "text": ...}]``) is joined too. Anything else raises ValueError.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        content = completion.get("content", "")
        if isinstance(content, list):
            return "".join(
                part.get("text", "") if isinstance(part, dict) else str(part) for part in content
            )
        return "" if content is None else str(content)
    if isinstance(completion, (list, tuple)):
        return "".join(completion_text(message) for message in completion
                       if not (isinstance(message, dict) and message.get("role") == "tool"))
    raise ValueError(
        "completions: expected a string or a list of chat messages per completion, "
        f"got {type(completion).__name__}"
    )


_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str | None:
    """The stripped content of the **last** complete ``<answer>...</answer>`` block, or None.

    Unlike the reference code's extractor (used only inside :func:`paper_reward`), the block
    need not end the text and several blocks are allowed (the last one counts).
    """
    matches = _ANSWER_BLOCK.findall(text)
    return matches[-1].strip() if matches else None


# A number: optional sign (not when it is a binary minus right after a digit, letter or
# ")"), digits with optional thousands separators, optional decimals, optional "/denominator".
_NUMBER = re.compile(
    r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?:\.\d+)?)?"
    r"|(?:(?<![\w)])-)?\.\d+"
)


def extract_last_number(text: str) -> str | None:
    """The last number written in ``text``, thousands separators removed, or None.

    Handles signs (``-4``; a minus right after a digit, letter or ``)`` is read as a binary
    minus: ``"5-3"`` gives ``"3"``), decimals (``"2.50"``), thousands separators
    (``"1,234"`` gives ``"1234"``) and simple fractions (``"3/4"``). A sentence-final period is
    not part of the number (``"is 18."`` gives ``"18"``).
    """
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    return matches[-1].replace(",", "")


def _find_closing_brace(text: str, open_index: int) -> int | None:
    """Index of the ``}`` matching the ``{`` at ``open_index`` (escaped ``\\{``/``\\}`` skipped)."""
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":  # skip the escaped character (\{, \}, \\)
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


_BOXED = re.compile(r"\\(?:boxed|fbox)")


def extract_boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``, or None.

    Braces are matched with a depth counter, so nested LaTeX such as
    ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}`` (the reference code's regex
    ``\\boxed\\{([^}]*)\\}`` would cut it at the first ``}``). The brace-less form of the
    Hendrycks MATH solutions (``\\boxed 5``) gives the text up to the next ``$`` or whitespace.
    An unclosed last box (a truncated reply) gives None.
    """
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    end = matches[-1].end()
    rest = text[end:]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        open_index = end + (len(rest) - len(stripped))
        close_index = _find_closing_brace(text, open_index)
        if close_index is None:
            return None
        return text[open_index + 1 : close_index].strip()
    if rest[:1].isspace() and stripped:
        return re.split(r"[\s$]", stripped, maxsplit=1)[0] or None
    return None


def extract_final_answer(text: str, answer_from: str = "auto") -> str | None:
    """Extract the final answer of a reply.

    Args:
        text: the completion text.
        answer_from: ``"tag"`` (the last ``<answer>`` block, :func:`extract_answer`),
            ``"boxed"`` (the last ``\\boxed{}``, :func:`extract_boxed_answer`),
            ``"last_number"`` (:func:`extract_last_number`), or ``"auto"`` (tag, else boxed,
            else last number).
    Returns:
        The answer string, or None when nothing could be extracted.
    """
    if answer_from == "tag":
        return extract_answer(text)
    if answer_from == "boxed":
        return extract_boxed_answer(text)
    if answer_from == "last_number":
        return extract_last_number(text)
    if answer_from == "auto":
        for found in (extract_answer(text), extract_boxed_answer(text)):
            if found is not None and found != "":
                return found
        return extract_last_number(text)
    raise ValueError(f"answer_from: expected one of {ANSWER_FROM}, got {answer_from!r}")


# ---------------------------------------------------------------------------------------
# The paper's reward (reference code: reward_math.py of github.com/winstonsmith1897/GTPO)
# ---------------------------------------------------------------------------------------

# The reference code's regexes, verbatim. ``$`` without re.MULTILINE matches at the very end
# of the text or just before one final newline.
_PAPER_REASONING = re.compile(r"<reasoning>.*?</reasoning>", re.DOTALL)
_PAPER_ANSWER_AT_END = re.compile(r"<answer>.*?</answer>$", re.DOTALL)
_PAPER_EXTRACT = re.compile(r"<answer>\s*(.*?)\s*</answer>$", re.DOTALL)

PAPER_FORMAT_FULL = 10.0
PAPER_CORRECT = 10.0
PAPER_MAX = PAPER_FORMAT_FULL + PAPER_CORRECT


def paper_format_score(text: str) -> float:
    """The paper's format score of one completion: one of {0, 1.0, 1.5, 10}.

    Exact port of ``compute_format_reward`` in the reference ``reward_math.py``:

    * ``has_reasoning``: a ``<reasoning>...</reasoning>`` block anywhere (non-greedy, may span
      lines);
    * ``has_answer``: an ``<answer>...</answer>`` block that **ends the text** (regex
      ``<answer>.*?</answer>$``; a single trailing newline is allowed, anything else after
      ``</answer>`` is not);
    * both: **10.0**;
    * otherwise partial credit, summed over the two blocks: the reasoning block alone earns
      1.0, or 1.5 when an ``<answer>`` or ``</answer>`` tag appears anywhere (the other block's
      tags "partially" present); the ending answer block alone earns 1.0, or 1.5 when a
      ``<reasoning>`` or ``</reasoning>`` tag appears. Since both blocks together give 10,
      at most one block scores, so the possible values are exactly {0, 1.0, 1.5, 10}.

    Examples (see tests/test_rewards.py for more):
        ``"<reasoning>r</reasoning>\\n<answer>4</answer>"`` -> 10.0;
        ``"<reasoning>r</reasoning> so 4"`` -> 1.0;
        ``"<reasoning>r</reasoning><answer>4</answer> done"`` -> 1.5 (answer block not at end);
        ``"<reasoning>r ... <answer>4</answer>"`` -> 1.5 (no ``</reasoning>``);
        ``"the answer is 4"`` -> 0.0.
    """
    has_reasoning = _PAPER_REASONING.search(text) is not None
    has_answer = _PAPER_ANSWER_AT_END.search(text) is not None
    if has_reasoning and has_answer:
        return PAPER_FORMAT_FULL
    score = 0.0
    if has_reasoning:
        score += 1.5 if ("<answer>" in text or "</answer>" in text) else 1.0
    if has_answer:
        score += 1.5 if ("<reasoning>" in text or "</reasoning>" in text) else 1.0
    return score


def _reference_float_close(pred: float, gold: float) -> bool:
    """``numpy.isclose(pred, gold, atol=1e-2)`` (rtol 1e-5 relative to ``gold``), in Python."""
    if pred == gold:  # equal infinities
        return True
    return abs(pred - gold) <= 1e-2 + 1e-5 * abs(gold)


def paper_correctness_score(text: str, gold: str) -> float:
    """The paper's correctness score of one completion: 10.0 or 0.0.

    Exact port of ``compute_correctness_reward`` in the reference ``reward_math.py``. The
    predicted answer is the stripped content of ``<answer>\\s*(.*?)\\s*</answer>$`` (the answer
    block must end the text; with several blocks the non-greedy match still runs from the
    *first* ``<answer>`` to the final ``</answer>``). It scores 10 when

    * both it and ``gold`` convert with Python ``float`` and
      ``|pred - gold| <= 0.01 + 1e-5 * |gold|`` (numpy.isclose with atol=1e-2), or
    * the gold string is contained in the predicted string (``"5"`` in ``"15"`` counts: a
      quirk of the reference code kept on purpose so the reward is the paper's).

    ``gold`` is used as given (the reference code extracted it from a formatted target; here
    the dataset's ``answer`` column already holds the bare gold answer). Note that GSM8K gold
    answers are loaded without thousands separators, so a prediction ``"1,000"`` for gold
    ``"1000"`` scores 0 (``float("1,000")`` fails and ``"1000"`` is not contained).
    """
    match = _PAPER_EXTRACT.search(text)
    if match is None:
        return 0.0
    pred = match.group(1).strip()
    gold = str(gold).strip()
    try:
        if _reference_float_close(float(pred), float(gold)):
            return PAPER_CORRECT
    except (ValueError, OverflowError):
        pass
    return PAPER_CORRECT if gold in pred else 0.0


def paper_score(text: str, gold: str) -> float:
    """The paper's total reward of one completion, in [0, 20].

    Format score (:func:`paper_format_score`) plus the correctness score
    (:func:`paper_correctness_score`), the latter checked **only when the format score is 10**,
    as in the reference ``final_reward``. Values: {0, 1, 1.5, 10, 20}.
    """
    fmt = paper_format_score(text)
    if fmt < PAPER_FORMAT_FULL:
        return fmt
    return fmt + paper_correctness_score(text, gold)


def _gold_list(answer: Sequence[Any] | None, n: int, function: str) -> list[Any]:
    if answer is None:
        raise ValueError(
            f"{function}: needs the dataset column 'answer' (the gold answer), which the "
            "trainer passes as answer=[...]; the dataset has no such column"
        )
    if len(answer) != n:
        raise ValueError(
            f"{function}: 'answer' has {len(answer)} entries but there are {n} completions"
        )
    return list(answer)


def _is_missing(gold: Any) -> bool:
    return gold is None or (isinstance(gold, str) and gold.strip() == "")


def paper_reward(
    *, completions: Sequence[Any], answer: Sequence[Any] | None = None, **kwargs: Any
) -> list[float | None]:
    """The GTPO paper's reward in [0, 20] for each completion (reference ``final_reward``).

    ``completions (B,)``, ``answer (B,)`` gold answers -> ``rewards (B,)``: see
    :func:`paper_score`. A row whose gold answer is None/empty gets None.
    """
    golds = _gold_list(answer, len(completions), "paper_reward")
    return [
        None if _is_missing(gold) else paper_score(completion_text(c), str(gold))
        for c, gold in zip(completions, golds)
    ]


def paper_reward_normalized(
    *, completions: Sequence[Any], answer: Sequence[Any] | None = None, **kwargs: Any
) -> list[float | None]:
    """:func:`paper_reward` divided by 20, in [0, 1]. ``rewards (B,)``."""
    return [
        None if r is None else r / PAPER_MAX
        for r in paper_reward(completions=completions, answer=answer)
    ]


# ---------------------------------------------------------------------------------------
# Format rewards
# ---------------------------------------------------------------------------------------

_FORMAT_TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")


def format_reward(*, completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 when the paper's full format holds (:func:`paper_format_score` is 10), else 0.0.

    Full format: a ``<reasoning>...</reasoning>`` block somewhere and an
    ``<answer>...</answer>`` block ending the text. ``rewards (B,)``.
    """
    return [
        1.0 if paper_format_score(completion_text(c)) >= PAPER_FORMAT_FULL else 0.0
        for c in completions
    ]


def format_soft_reward(*, completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """0.25 for each of the four paper tags that appears exactly once, in [0, 1].

    A dense shaping signal for models that rarely write the tags (after the Unsloth GRPO
    notebooks' ``xmlcount_reward_func``, without its penalty for trailing text). It ignores
    tag order; 1.0 here does not imply :func:`format_reward` = 1. ``rewards (B,)``.
    """
    out = []
    for c in completions:
        text = completion_text(c)
        out.append(0.25 * sum(text.count(tag) == 1 for tag in _FORMAT_TAGS))
    return out


# ---------------------------------------------------------------------------------------
# math-verify based correctness
# ---------------------------------------------------------------------------------------


def _math_verify_timeout() -> int | None:
    """math-verify's signal-based timeout only works in the main thread: None elsewhere."""
    if threading.current_thread() is threading.main_thread():
        return MATH_VERIFY_TIMEOUT_S
    return None


@functools.lru_cache(maxsize=1 << 15)
def _parse_cached(text: str) -> tuple:
    """math-verify parse of an answer string (cached; never raises; ``()`` when unparsable).

    A bare answer (``\\frac{1}{2}``, ``1,000``, ``x=3``) is parsed as LaTeX math by wrapping
    it in ``$...$``; text that already carries math delimiters or a ``\\boxed`` is parsed as
    is. If the wrapped form gives nothing, the raw text is tried.
    """
    from math_verify import parse

    timeout = _math_verify_timeout()
    text = text.strip()
    if not text:
        return ()
    has_delimiters = "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text
    candidates = [text] if has_delimiters else [f"${text}$", text]
    for candidate in candidates:
        try:
            parsed = parse(candidate, parsing_timeout=timeout)
        except Exception:  # math-verify should not raise, but user text is arbitrary
            parsed = []
        if parsed:
            return tuple(parsed)
    return ()


def _verify(gold: tuple, pred: tuple) -> bool:
    from math_verify import verify

    if not gold or not pred:
        return False
    try:
        return bool(verify(list(gold), list(pred), timeout_seconds=_math_verify_timeout()))
    except Exception:
        return False


def _normalise_string(text: str) -> str:
    return " ".join(str(text).split())


def answers_equivalent(a: str | None, b: str | None) -> bool:
    """Whether two final answers are mathematically equivalent (math-verify).

    Fast path: identical strings after whitespace normalisation. Otherwise both are parsed
    with math-verify (cached) and compared in both directions (math-verify's ``verify`` is
    not symmetric), so the relation is symmetric: ``\\frac{1}{2}``, ``0.5`` and ``1/2`` are
    equivalent, ``1,000`` and ``1000`` too. Never raises; None or empty answers are never
    equivalent to anything. Used by evaluation to group answers for maj@k.
    """
    pair = _normalised_pair(a, b)
    if pair is None:
        return False
    if pair[0] == pair[1]:
        return True
    pa, pb = _parse_cached(pair[0]), _parse_cached(pair[1])
    return _verify(pa, pb) or _verify(pb, pa)


def _normalised_pair(a: str | None, b: str | None) -> tuple[str, str] | None:
    """Both answers normalised, or None when either is missing or empty."""
    if a is None or b is None:
        return None
    a_norm, b_norm = _normalise_string(a), _normalise_string(b)
    return (a_norm, b_norm) if a_norm and b_norm else None


def _is_correct(pred: str | None, gold: str) -> bool:
    """Gold-vs-prediction check: ``verify(gold, pred)`` with the gold as reference."""
    pair = _normalised_pair(pred, gold)
    if pair is None:
        return False
    pred_norm, gold_norm = pair
    return pred_norm == gold_norm or _verify(_parse_cached(gold_norm), _parse_cached(pred_norm))


def correctness_reward(
    *,
    completions: Sequence[Any],
    answer: Sequence[Any] | None = None,
    answer_from: str = "auto",
    **kwargs: Any,
) -> list[float | None]:
    """1.0 if the extracted answer is mathematically equal to the gold ``answer``, else 0.0.

    The answer is read per ``answer_from`` (:func:`extract_final_answer`: ``"tag"``,
    ``"boxed"``, ``"last_number"`` or ``"auto"``) and compared with math-verify
    (``verify(parse(gold), parse(pred))``), so LaTeX and plain numbers match
    (``\\frac{1}{2}`` == ``0.5`` == ``1/2``). Unparsable or missing answers give 0.0, never an
    exception; a row whose gold answer is None/empty gives None. ``rewards (B,)``.
    """
    if answer_from not in ANSWER_FROM:
        raise ValueError(f"answer_from: expected one of {ANSWER_FROM}, got {answer_from!r}")
    golds = _gold_list(answer, len(completions), "correctness_reward")
    out: list[float | None] = []
    for c, gold in zip(completions, golds):
        if _is_missing(gold):
            out.append(None)
            continue
        pred = extract_final_answer(completion_text(c), answer_from)
        out.append(1.0 if _is_correct(pred, str(gold)) else 0.0)
    return out


def last_number_correctness_reward(
    *, completions: Sequence[Any], answer: Sequence[Any] | None = None, **kwargs: Any
) -> list[float | None]:
    """:func:`correctness_reward` with ``answer_from="last_number"``. ``rewards (B,)``.

    What the CPU demo uses: SmolLM2-135M never writes ``<answer>`` tags, so the last number
    of its reply is read as its answer.
    """
    return correctness_reward(completions=completions, answer=answer, answer_from="last_number")


# ---------------------------------------------------------------------------------------
# reasoning-gym
# ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _reasoning_gym_scorer(task: str, config_json: str) -> Callable[[Any, dict], float]:
    """``score_answer`` of a reasoning-gym dataset re-created by name (and config), cached."""
    try:
        import reasoning_gym
    except ImportError as exc:  # pragma: no cover - optional dependency
        raise ImportError(
            "reasoning_gym_reward needs the reasoning-gym package: pip install reasoning-gym"
        ) from exc
    config = json.loads(config_json) if config_json else {}
    try:
        dataset = reasoning_gym.create_dataset(task, size=1, seed=0, **config)
    except Exception as exc:
        raise ValueError(
            f"reasoning_gym_reward: cannot re-create reasoning-gym task {task!r} with config "
            f"{config}: {exc}"
        ) from exc
    return dataset.score_answer


def _row_value(column: Sequence[Any] | None, i: int) -> Any:
    return None if column is None else column[i]


def reasoning_gym_reward(
    *,
    completions: Sequence[Any],
    rg_entry: Sequence[Any] | None = None,
    task: Sequence[Any] | None = None,
    rg_config: Sequence[Any] | None = None,
    answer_from: str = "auto",
    **kwargs: Any,
) -> list[float | None]:
    """The reasoning-gym task's own scorer, ``dataset.score_answer(answer, entry)``, in [0, 1].

    Columns (as written by ``gtpo.data.load_task`` for reasoning-gym tasks): ``rg_entry`` the
    JSON of the generated entry (question, answer, metadata), ``task`` the reasoning-gym task
    name (else the entry's ``metadata.source_dataset``), ``rg_config`` the JSON of the task
    config used to generate it (optional). The dataset object is re-created by name and config
    and cached. The answer is extracted per ``answer_from`` (:func:`extract_final_answer`).
    A scorer exception on a malformed reply scores 0.0; a row with no ``rg_entry`` gets None.
    ``rewards (B,)``.
    """
    if answer_from not in ANSWER_FROM:
        raise ValueError(f"answer_from: expected one of {ANSWER_FROM}, got {answer_from!r}")
    if rg_entry is None:
        raise ValueError(
            "reasoning_gym_reward: needs the dataset column 'rg_entry' (written by "
            "gtpo.data.load_task for reasoning-gym tasks such as 'rg:basic_arithmetic'); "
            "the dataset has no such column"
        )
    out: list[float | None] = []
    for i, c in enumerate(completions):
        raw = rg_entry[i]
        if raw is None or raw == "":
            out.append(None)
            continue
        entry = json.loads(raw) if isinstance(raw, str) else dict(raw)
        name = _row_value(task, i) or (entry.get("metadata") or {}).get("source_dataset")
        if not name:
            raise ValueError(
                f"reasoning_gym_reward: row {i} has no task name (no 'task' column and no "
                "metadata.source_dataset in its rg_entry)"
            )
        name = str(name).removeprefix("rg:")
        config = _row_value(rg_config, i)
        if config is not None and not isinstance(config, str):
            config = json.dumps(config, sort_keys=True)
        score_answer = _reasoning_gym_scorer(name, config or "")
        pred = extract_final_answer(completion_text(c), answer_from)
        try:
            score = float(score_answer(pred, entry))
        except Exception:
            score = 0.0
        out.append(score)
    return out


# ---------------------------------------------------------------------------------------
# Registry and resolution of reward specs
# ---------------------------------------------------------------------------------------

REWARD_FUNCTIONS: dict[str, Callable[..., list[float | None]]] = {
    "paper": paper_reward,
    "paper_normalized": paper_reward_normalized,
    "correctness": correctness_reward,
    "last_number_correctness": last_number_correctness_reward,
    "format": format_reward,
    "format_soft": format_soft_reward,
    "reasoning_gym": reasoning_gym_reward,
}


def _load_module_from_file(path: Path, spec_text: str):
    if not path.is_file():
        raise ValueError(f"reward {spec_text!r}: file {str(path)!r} does not exist")
    digest = hashlib.sha256(str(path.resolve()).encode("utf-8")).hexdigest()[:16]
    module_name = f"gtpo_user_reward_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"reward {spec_text!r}: cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    # registered so that functions defined there can be pickled (worker processes)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ValueError(f"reward {spec_text!r}: importing {str(path)!r} failed: {exc!r}") from exc
    return module


#: TRL's reward names (``trl grpo``'s registry: ``trl.rewards``; the overlong punishment with the values ``trl grpo``
#: uses) -> (attribute of ``trl.rewards``, factory keyword arguments or None for the function itself)
TRL_REWARDS: dict[str, tuple[str, dict[str, int] | None]] = {
    "accuracy_reward": ("accuracy_reward", None),
    "reasoning_accuracy_reward": ("reasoning_accuracy_reward", None),
    "think_format_reward": ("think_format_reward", None),
    "get_soft_overlong_punishment": ("get_soft_overlong_punishment",
                                     {"max_completion_len": 1280, "soft_punish_cache": 256}),
}


def _trl_reward(name: str) -> Callable[..., Any]:
    try:
        import trl.rewards
    except ImportError as exc:
        raise ValueError(f"reward {name!r} is one of TRL's rewards (trl.rewards), and trl is not installed: "
                         "pip install trl") from exc
    attr, factory_kwargs = TRL_REWARDS[name]
    func = getattr(trl.rewards, attr)
    return func(**factory_kwargs) if factory_kwargs is not None else func


def _is_reward_model_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def _looks_like_hub_model(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and ":" not in spec and not spec.endswith(".py") \
        and not spec.startswith((".", "~"))


def resolve_reward(spec: Any) -> Callable[..., Any]:
    """Turn a reward spec into a reward function.

    Accepted specs:

    * a callable: returned as is (``async def`` functions too: the scorer awaits them); a
      ``torch.nn.Module`` (a sequence-classification model, as TRL takes it) becomes a
      :class:`gtpo.rewards.scoring.SequenceClassificationReward` with its tokenizer;
    * a built-in name, a key of :data:`REWARD_FUNCTIONS` (``"paper"``, ``"correctness"``, ...);
    * one of TRL's reward names (:data:`TRL_REWARDS`: ``accuracy_reward``, ``think_format_reward``, ...; they read
      conversational completions and TRL's ``solution`` column);
    * ``"package.module:function"``: imported with importlib; TRL's dotted form
      ``"package.module.function"`` too (the current directory importable, as ``trl grpo`` does);
    * ``"path/to/file.py:function"``: the file is loaded as a module (``importlib.util``);
    * a local directory holding a sequence-classification model, or a hub model id ``org/name`` (TRL's
      ``reward_model_name_or_path``): the model and its tokenizer (:class:`~gtpo.rewards.scoring.SequenceClassificationReward`).

    Raises ValueError naming the spec and what is wrong: an unknown name (listing the
    built-in names), a missing module or file, a missing or non-callable attribute, a model that is
    not a sequence-classification model.
    """
    if _is_module(spec):
        from .scoring import SequenceClassificationReward

        return SequenceClassificationReward(spec)
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            "reward: expected a built-in name, 'module:function', 'file.py:function', a reward model or a "
            f"callable, got {spec!r}"
        )
    spec = spec.strip()
    if spec in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[spec]
    if spec in TRL_REWARDS:
        return _trl_reward(spec)
    if _is_reward_model_dir(Path(spec)) or (_looks_like_hub_model(spec) and not Path(spec).exists()):
        from .scoring import SequenceClassificationReward

        return SequenceClassificationReward.from_pretrained(spec)
    target, sep, attr = spec.rpartition(":")
    if not sep and "." in spec and "/" not in spec and not spec.endswith(".py"):
        target, sep, attr = spec.rpartition(".")  # TRL's dotted import path
        if target and attr:
            return _import_reward(spec, target, attr, cwd_importable=True)
    if not sep or not target or not attr:
        raise ValueError(
            f"reward {spec!r}: unknown reward name; built-in rewards are "
            f"{sorted(REWARD_FUNCTIONS)}, TRL's {sorted(TRL_REWARDS)}, or give 'package.module:function', "
            "'path/to/file.py:function' or a reward model (a directory or a hub id)"
        )
    return _import_reward(spec, target, attr)


def _is_module(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.nn.Module`` (without importing torch when it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _import_reward(spec: str, target: str, attr: str, *, cwd_importable: bool = False) -> Callable[..., Any]:
    """``target`` (a module name or a ``.py`` file) imported and its ``attr``; ValueError naming ``spec``."""
    if target.endswith(".py"):
        module = _load_module_from_file(Path(target), spec)
    else:
        import os

        if cwd_importable and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ValueError(f"reward {spec!r}: cannot import module {target!r}: {exc}") from exc
    if not hasattr(module, attr):
        public = sorted(
            n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n))
        )
        raise ValueError(
            f"reward {spec!r}: {target!r} has no attribute {attr!r}; callables there: {public}"
        )
    function = getattr(module, attr)
    if not callable(function):
        raise ValueError(f"reward {spec!r}: {target}:{attr} is not callable")
    return function
