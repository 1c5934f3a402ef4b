"""Prompt templates: the paper's system prompts, ``TEMPLATES`` and :func:`make_prompt` (a question to a
standard or conversational prompt), and the paper's completion format for SFT warm-up.

Part of :mod:`gtpo.data` (which re-exports the public names). No torch, no ``datasets``.
"""

from __future__ import annotations

__all__ = [
    "SYSTEM_PROMPT",
    "FORMAT_SYSTEM_PROMPT",
    "ANSWER_ONLY_SYSTEM_PROMPT",
    "TEMPLATES",
    "make_prompt",
    "format_paper_completion",
]


# ---------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------

#: The system prompt of the GTPO reference code (``config.yaml`` of
#: github.com/winstonsmith1897/GTPO; its ``train_model.py`` default differs only by
#: "solving problems"). The paper: think step by step between the reasoning tags, then give
#: the final answer between the answer tags.
SYSTEM_PROMPT = (
    "You are a helpful assistant for solving math problems. Given a question, first think "
    "step by step between <reasoning> and </reasoning>. Then, give the final answer between "
    "<answer> and </answer>."
)


#: The explicit-skeleton system prompt of the Unsloth GRPO notebooks (template "unsloth").
FORMAT_SYSTEM_PROMPT = (
    "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"
)


#: System prompt of the "answer_only" template: only the tagged final answer.
ANSWER_ONLY_SYSTEM_PROMPT = (
    "Give only the final answer, between <answer> and </answer>, with no other text."
)


#: Prompt templates understood by :func:`make_prompt`.
TEMPLATES = ("paper", "unsloth", "plain", "answer_only", "none")


def make_prompt(
    question: str, *, template: str = "paper", system_prompt: str | None = None
) -> str | list[dict[str, str]]:
    """Build the prompt of one question.

    Templates:

    * ``"paper"`` (default): conversational, the paper's system prompt (:data:`SYSTEM_PROMPT`,
      or ``system_prompt``) then the question as the user message. The trainer applies the
      tokenizer's chat template, as the reference code does.
    * ``"unsloth"``: conversational, the Unsloth notebooks' format skeleton
      (:data:`FORMAT_SYSTEM_PROMPT`, or ``system_prompt``) then the question.
    * ``"answer_only"``: conversational, asks only for ``<answer>...</answer>``
      (:data:`ANSWER_ONLY_SYSTEM_PROMPT`, or ``system_prompt``).
    * ``"none"``: conversational, the question alone as a user message (no system message;
      passing ``system_prompt`` is an error).
    * ``"plain"``: a standard string prompt ``"Question: ...\\nAnswer:"`` for base models
      without a chat template; ``system_prompt``, when given, is prepended with a blank line.

    Returns:
        A string for ``"plain"``, else a list of ``{"role", "content"}`` messages.
    """
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question: expected a non-empty string, got {question!r}")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ValueError(f"system_prompt: expected a string or None, got {system_prompt!r}")
    defaults = {
        "paper": SYSTEM_PROMPT,
        "unsloth": FORMAT_SYSTEM_PROMPT,
        "answer_only": ANSWER_ONLY_SYSTEM_PROMPT,
    }
    if template in defaults:
        system = defaults[template] if system_prompt is None else system_prompt
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]
    if template == "none":
        if system_prompt is not None:
            raise ValueError(
                "system_prompt: template 'none' has no system message; use template='paper' "
                "with system_prompt=... instead"
            )
        return [{"role": "user", "content": question}]
    if template == "plain":
        text = f"Question: {question}\nAnswer:"
        return text if system_prompt is None else f"{system_prompt}\n\n{text}"
    raise ValueError(f"template: expected one of {TEMPLATES}, got {template!r}")


def format_paper_completion(reasoning: str, answer: str) -> str:
    """A target completion in the paper's format, for SFT warm-up.

    ``"<reasoning>\\n{reasoning}\\n</reasoning>\\n<answer>{answer}</answer>"``, the layout the
    reference code (``train_model.py``) builds from GSM8K/MATH solutions. It earns the full
    format score of :func:`gtpo.rewards.paper_format_score` (10) and, with the gold answer, the
    full paper reward (20).
    """
    return f"<reasoning>\n{reasoning.strip()}\n</reasoning>\n<answer>{str(answer).strip()}</answer>"
