"""Multi-turn rollouts with tools on gtpo's engine: TRL's user contract (``tools``, ``environment_factory``) run by
gtpo's sampler.

A completion is sampled turn by turn (:func:`tool_rollout`): the model's turn ends at its end-of-turn token, the
turn is parsed with the tokenizer's chat template (TRL's response schemas, :class:`Toolbox`), each tool call runs
(an exception or a timeout becomes a tool message with the error, never a crashed run), the tool messages are
rendered by the chat template and appended as **environment tokens** (``tool_mask`` 0), and the rows that called a
tool continue together in one batch, up to ``max_tool_calling_iterations`` turns and ``max_completion_length``
tokens (model and tool tokens together). The result is a :class:`~gtpo.sampling.rollout.Rollout` whose
``agent`` (:class:`AgentTrace`) holds the ``tool_mask (N, T)`` that :func:`gtpo.maths.method.loss_mask` removes from
the loss, the conversations (what reward functions get as ``completions``) and the per-completion counts
(``tools/*`` metrics, :func:`gtpo.run.step_metrics.agent_metrics`).

This mirrors TRL's ``GRPOTrainer._tool_call_loop`` (TRL 1.16) in behaviour: the same chat-template utilities
(``trl.chat_template_utils``: ``supports_tool_calling``, ``add_response_schema``, ``parse_response``, the
prefix-preserving training template), the same tool-message format (``{"role": "tool", "name", "content"}``,
an error as ``{"error": "..."}``), the same suffix rule (the tool turn's tokens are what the chat template adds
after the assistant's end-of-turn token), the same budget rule (a tool result that would exceed
``max_completion_length`` is dropped and the completion ends). TRL must be installed (it is the parser).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["AgentTrace", "Toolbox", "check_tools", "environment_reward", "rollout_from_func", "run_tool_call",
           "tool_rollout"]


# ----------------------------------------------------------------------------------------------- the trace
@dataclass
class AgentTrace:
    """What a multi-turn rollout adds to a :class:`~gtpo.sampling.rollout.Rollout` (``N`` rows, prompt-major).

    Attributes:
        tool_mask: ``(N, T)`` 1 on tokens the policy produced, 0 on tool / environment tokens (TRL's ``tool_mask``);
            1 on padding (the completion mask zeroes it).
        conversations: ``N`` lists of messages after the prompt: assistant turns (with ``tool_calls`` where the
            model called tools) and tool messages, in order; reward functions get them as ``completions``.
        calls: ``(N,)`` tool calls made by each completion.
        failures: ``(N,)`` calls that raised, timed out, named an unknown tool or were malformed.
        environments: ``N`` environment instances (``environment_factory``) or None.
        fields: a ``rollout_func``'s extra keys, ``N`` values each, passed to the reward functions (TRL's
            ``extra_fields``); None otherwise. ``conversations`` is None for a ``rollout_func`` on standard prompts.
    """

    tool_mask: torch.Tensor
    conversations: list[list[dict]] | None
    calls: torch.Tensor
    failures: torch.Tensor
    environments: list | None = None
    fields: dict[str, list] | None = None

    def rows(self, sl: slice) -> "AgentTrace":
        return AgentTrace(self.tool_mask[sl], None if self.conversations is None else self.conversations[sl],
                          self.calls[sl], self.failures[sl],
                          None if self.environments is None else self.environments[sl],
                          None if self.fields is None else {k: v[sl] for k, v in self.fields.items()})

    @staticmethod
    def concat(traces: list["AgentTrace"], width: int) -> "AgentTrace":
        """The traces one after another, ``tool_mask`` padded with 1 on the right to ``width`` columns."""
        pad = torch.nn.functional.pad
        envs = None if any(t.environments is None for t in traces) else [e for t in traces for e in t.environments]
        convs = None if any(t.conversations is None for t in traces) else [c for t in traces for c in t.conversations]
        fields = None if any(t.fields is None for t in traces) else \
            {k: [v for t in traces for v in t.fields[k]] for k in traces[0].fields}
        return AgentTrace(torch.cat([pad(t.tool_mask, (0, width - t.tool_mask.shape[1]), value=1) for t in traces]),
                          convs, torch.cat([t.calls for t in traces]), torch.cat([t.failures for t in traces]), envs,
                          fields)


def environment_reward(name: str) -> Callable:
    """The reward function of an environment class that defines ``get_reward()`` (TRL's rule): each completion's
    environment scores it (``environments``: one instance per completion); named ``name`` (the class's)."""
    def reward(environments=None, **kwargs):
        return [e.get_reward() for e in environments]

    reward.__name__ = name
    return reward


# ----------------------------------------------------------------------------------------------- tool calls
def run_tool_call(func: Callable, arguments: dict, timeout: float | None) -> tuple[Any, bool]:
    """``(result, failed)`` of ``func(**arguments)`` (a coroutine function is awaited), run in a daemon thread for at
    most ``timeout`` seconds (None: no limit). An exception gives ``({"error": str(exc)}, True)`` as TRL's tool
    loop records it; a call still running after ``timeout`` is abandoned (its thread is left to finish) and gives
    ``({"error": "timed out after <timeout> s"}, True)``."""
    box: dict[str, Any] = {}

    def target():
        try:
            out = func(**arguments)
            box["result"] = asyncio.run(out) if inspect.isawaitable(out) else out
        except BaseException as err:  # noqa: BLE001 -- becomes the tool message
            box["error"] = err

    thread = threading.Thread(target=target, name=f"gtpo-tool-{getattr(func, '__name__', 'tool')}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return {"error": f"tool call {getattr(func, '__name__', 'tool')!r} timed out after {timeout:g} s"}, True
    if "error" in box:
        err = box["error"]
        return {"error": str(err) or type(err).__name__}, True
    return box.get("result"), False


def _tool_methods(environment) -> list[Callable]:
    """The tools of an environment instance: its public methods (listed on the class), but ``reset`` and
    ``get_reward``, as TRL exposes them."""
    return [getattr(environment, name) for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


def check_tools(tools: list[Callable] | None, environment_factory: Callable | None = None, *,
                where: str = "GTPOTrainer"):
    """Refuse, naming ``where`` and the tool, what no chat template can show the model: a tool that is not callable
    or has no JSON schema (type hints and a docstring line per argument, ``transformers.utils.get_json_schema``), two
    tools of one name, an ``environment_factory`` that is a dict (TRL's multi-environment routing), that fails to
    build, or whose instances have no ``reset`` or no tool method. Needs no tokenizer: the application layer calls it
    before any model loads. Returns the environment instance it built (None without ``environment_factory``)."""
    from transformers.utils import get_json_schema

    tools = list(tools or [])
    for i, tool in enumerate(tools):
        if not callable(tool):
            raise ValueError(f"{where}: tools[{i}] is {type(tool).__name__}, not a function")
    probe = None
    if isinstance(environment_factory, dict):
        raise ValueError(f"{where}: environment_factory as a dict of environments (TRL's multi-environment "
                         "routing by an 'environment' column) is not supported on gtpo's engine: give one class, "
                         "or train with engine: trl")
    if environment_factory is not None:
        name = getattr(environment_factory, "__name__", type(environment_factory).__name__)
        try:
            probe = environment_factory()
        except Exception as err:
            raise ValueError(f"{where}: environment_factory {name}() raised {type(err).__name__}: {err}") from err
        if not callable(getattr(probe, "reset", None)):
            raise ValueError(f"{where}: environment_factory {name}: its instances must define a callable "
                             "reset(**row) (called before each rollout with the dataset row; returns None or an "
                             "observation appended to the prompt), as TRL's environment_factory requires")
        if not _tool_methods(probe) and not tools:
            raise ValueError(f"{where}: environment_factory {name} has no public method to use as a tool")
    named = [(f"tools[{i}] {getattr(t, '__name__', t)!r}", t) for i, t in enumerate(tools)]
    if probe is not None:
        named += [(f"environment_factory {type(probe).__name__}.{m.__name__}", m) for m in _tool_methods(probe)]
    for label, tool in named:
        try:
            get_json_schema(tool)
        except Exception as err:  # DocstringParsingException / TypeHintParsingException
            raise ValueError(f"{where}: {label}: the chat template shows the model each tool's JSON schema, "
                             f"built from its type hints and docstring, and this one has none: {err}. Give it type "
                             "hints and a Google-style docstring with an 'Args:' line per argument") from err
    seen: dict[str, str] = {}
    for label, tool in named:
        if tool.__name__ in seen:
            raise ValueError(f"{where}: {label} and {seen[tool.__name__]} have the same name "
                             f"{tool.__name__!r}: the model calls tools by name")
        seen[tool.__name__] = label
    return probe


class Toolbox:
    """The tools of a run (TRL's ``tools`` and ``environment_factory``) and the tokenizer that renders and parses
    them. Built once, before training: every problem a user can cause is refused here, naming what and where.

    Args:
        tokenizer: the policy's tokenizer. Its chat template must render tool calls and tool messages (TRL's
            ``supports_tool_calling``); a response schema is added for the templates TRL knows
            (``add_response_schema``: Qwen2.5/3, Llama 3.1/3.2, GPT-OSS, ...) unless one is set; a template that is
            not prefix-preserving is replaced, for rendering only, by TRL's training template.
        tools: Python functions (sync or async) with type hints and a Google-style docstring describing every
            argument (what the chat template shows the model: ``transformers.utils.get_json_schema``).
        environment_factory: a class (or callable) whose instances have ``reset(**dataset_row)`` (returning None or
            an observation appended to the prompt's last message) and public methods that are the tools; one
            instance per completion, reused across steps. A ``get_reward()`` method is not a tool.
        where: how errors name the caller (``GTPOTrainer``, a YAML's key).
    """

    def __init__(self, tokenizer, tools: list[Callable] | None = None, environment_factory: Callable | None = None,
                 *, where: str = "GTPOTrainer"):
        try:
            from trl import chat_template_utils as ctu
        except ImportError as err:  # pragma: no cover - trl is in the test extra
            raise ImportError(f"{where}: tools / environment_factory parse the model's tool calls with TRL's chat "
                              "template utilities: pip install 'trl>=1.16,<1.17' (the 'agents' extra: "
                              "pip install 'gtpo[agents]')") from err
        self._ctu = ctu
        self.tokenizer = tokenizer
        self.where = where
        self.tools = list(tools or [])
        self.environment_factory = environment_factory
        probe = check_tools(self.tools, environment_factory, where=where)
        self.has_env_reward = probe is not None and callable(getattr(probe, "get_reward", None))
        self._pool = [probe] if probe is not None else []
        # the chat template: renders tools, parses tool calls, appends tool turns by prefix (TRL's requirements)
        template_name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        if not ctu.supports_tool_calling(tokenizer):
            raise ValueError(f"{where}: the chat template of the tokenizer {template_name!r} cannot render a tool "
                             "call and a tool message (TRL's supports_tool_calling), so the model could not be shown "
                             "its tools nor their results. Use a model whose template supports tools (Qwen2.5/3, "
                             "Llama 3.1+, ...) or set tokenizer.chat_template to one (trl/chat_templates/*.jinja)")
        if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
            try:
                ctu.add_response_schema(tokenizer)
            except ValueError as err:
                raise ValueError(f"{where}: no parser for the tool calls of the chat template of {template_name!r}: "
                                 f"{err}") from err
        self.chat_template = None if ctu.is_chat_template_prefix_preserving(tokenizer) else \
            ctu.get_training_chat_template(tokenizer)
        self._suffix_cache: dict[tuple[str, int], list[int]] = {}

    def prompt_renderer(self) -> Callable[[list[dict]], list[int]]:
        """``render(messages) -> ids``: a dataset prompt with the run's tools, as the first turn sees it (before any
        environment observation); what ``max_prompt_length`` measures."""
        tools = self.tools_of(self._pool[0] if self._pool else None)
        return lambda messages: self.render(list(messages), tools)

    # -------------------------------------------------------------------------------------- per rollout
    def environments(self, n: int) -> list | None:
        """``n`` environment instances (None without ``environment_factory``), from the pool (grown as needed)."""
        if self.environment_factory is None:
            return None
        while len(self._pool) < n:
            self._pool.append(self.environment_factory())
        return self._pool[:n]

    def tools_of(self, environment) -> list[Callable]:
        """The tools a completion may call: the standalone ones plus its environment's methods."""
        return self.tools + ([] if environment is None else _tool_methods(environment))

    def render(self, messages: list[dict], tools: list[Callable]) -> list[int]:
        """Token ids of a conversational prompt with its tools, ready for the assistant's turn."""
        return list(self.tokenizer.apply_chat_template(
            messages, tools=tools or None, chat_template=self.chat_template, add_generation_prompt=True,
            tokenize=True, return_dict=False))

    def parse(self, ids: list[int], prefix: list[int], tools: list[Callable]) -> dict:
        """One assistant turn as a message (``tool_calls`` when it calls tools; plain text when it cannot be parsed),
        by TRL's ``parse_response``."""
        return self._ctu.parse_response(self.tokenizer, ids, prefix=prefix, tools=tools)

    def suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        """The tokens the chat template appends after an assistant's tool-call turn (ended by its EOS) for
        ``tool_messages``, up to the next assistant turn's header: the rendered conversation with the tool messages
        minus the one without them (cut after its last EOS)."""
        tok = self.tokenizer
        calls = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
        head = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": calls}]
        kwargs = dict(tokenize=True, chat_template=self.chat_template, return_dict=False)
        prefix = list(tok.apply_chat_template(head, add_generation_prompt=False, **kwargs))
        full = list(tok.apply_chat_template(head + tool_messages, add_generation_prompt=True, **kwargs))
        eos = [i for i, t in enumerate(prefix) if t == tok.eos_token_id]
        if eos:
            prefix = prefix[:eos[-1] + 1]
        if full[:len(prefix)] != prefix:
            raise ValueError(f"{self.where}: the chat template renders an assistant turn differently once tool "
                             "messages follow it; it is not prefix-preserving")
        return full[len(prefix):]

    def execute(self, message: dict, tools: list[Callable], timeout: float | None) -> tuple[list[dict], int]:
        """The tool messages of an assistant ``message``'s ``tool_calls`` and how many calls failed."""
        table = {t.__name__: t for t in tools}
        out, failed = [], 0
        for call in message.get("tool_calls") or []:
            if call.get("type", "function") != "function" or "function" not in call:
                name, result, bad = call.get("name", "unknown"), {"error": f"Unsupported tool call: {call!r:.200}"}, True
            else:
                name, arguments = call["function"]["name"], call["function"].get("arguments") or {}
                if name not in table:
                    result, bad = {"error": f"Tool {name} not found."}, True
                elif not isinstance(arguments, dict):
                    result, bad = {"error": f"Tool {name}: arguments must be an object, got {arguments!r:.200}"}, True
                else:
                    result, bad = run_tool_call(table[name], arguments, timeout)
            failed += bad
            out.append({"role": "tool", "name": name, "content": result if isinstance(result, list) else str(result)})
        return out, failed


# ----------------------------------------------------------------------------------------------- the rollout
def tool_rollout(model, toolbox: Toolbox, prompts: list[list[dict]], rows: list[dict], *, sampling, num_samples: int,
                 max_iterations: int | None, timeout: float | None, eos_ids: list[int], sample: Callable) -> "Any":
    """``num_samples`` multi-turn completions for each of the ``P`` conversational ``prompts``.

    Args:
        model: the policy (its ``config.max_position_embeddings`` bounds a turn's input).
        toolbox: the run's :class:`Toolbox`.
        prompts: ``P`` prompts, each a list of chat messages.
        rows: ``P`` dataset rows (dicts), passed to each environment's ``reset(**row)``.
        sampling: the rollout's :class:`~gtpo.sampling.rollout.SamplingParams`; ``max_new_tokens`` is the whole
            completion's budget (model and tool tokens, TRL's ``max_completion_length``).
        num_samples: G.
        max_iterations: at most this many tool-calling turns per completion (None: no limit).
        timeout: seconds per tool call (None: no limit).
        eos_ids: the end-of-turn ids (a completion whose last token is none of them was cut by the budget).
        sample: ``sample(prompt_ids, num_samples, sampling) -> Rollout``: one turn for each prompt (gtpo's
            :func:`~gtpo.sampling.rollout.generate` on the policy); the rows still calling tools are sampled
            together, one completion each.

    Returns:
        A :class:`~gtpo.sampling.rollout.Rollout` of ``N = P * num_samples`` rows (prompt-major): the first turn's
        prompt, the whole completion (model turns and tool turns, ``completion_mask`` 1 through its last token) and
        an :class:`AgentTrace` (``tool_mask``, conversations, call counts).
    """
    from .padding import left_pad
    from .rollout import Rollout

    tok = toolbox.tokenizer
    n = len(prompts) * num_samples
    budget = sampling.max_new_tokens
    envs = toolbox.environments(n)
    messages = [list(prompts[i // num_samples]) for i in range(n)]
    observed = False
    if envs is not None:
        for i, env in enumerate(envs):
            obs = env.reset(**rows[i // num_samples])
            if obs is not None:
                observed = True
                last = messages[i][-1]
                messages[i] = messages[i][:-1] + [{**last, "content": f"{last['content']}{obs}"}]
    tools = [toolbox.tools_of(None if envs is None else envs[i]) for i in range(n)]
    prompt_ids = [toolbox.render(messages[i], tools[i]) for i in range(n)]
    if observed or num_samples == 1:
        first = sample(prompt_ids, 1, sampling)
    else:  # one prompt per group: its prefill is shared by the group's rows
        first = sample(prompt_ids[::num_samples], num_samples, sampling)
    completion = [ids[m.bool()].tolist() for ids, m in zip(first.completion_ids, first.completion_mask)]
    tool_mask = [[1] * len(c) for c in completion]
    conversations = [[toolbox.parse(completion[i], prompt_ids[i], tools[i])] for i in range(n)]
    calls, failures = [0] * n, [0] * n
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None) or float("inf")
    active = [i for i in range(n) if conversations[i][-1].get("tool_calls")]
    turn = 0
    while active and (max_iterations is None or turn < max_iterations):
        inputs, keep = [], []
        for i in active:
            results, failed = toolbox.execute(conversations[i][-1], tools[i], timeout)
            calls[i] += len(results)
            failures[i] += failed
            extended = prompt_ids[i] + completion[i] + toolbox.suffix_ids(results)
            if len(extended) - len(prompt_ids[i]) > budget or len(extended) >= limit:
                continue  # TRL's rule: the results would not fit, the completion ends as it is (the calls counted)
            conversations[i].extend(results)
            inputs.append(extended)
            keep.append(i)
        if not keep:
            break
        room = [budget - (len(x) - len(prompt_ids[i])) for x, i in zip(inputs, keep)]
        nxt = sample(inputs, 1, dataclasses.replace(sampling, max_new_tokens=max(max(room), 1)))
        active = []
        for j, i in enumerate(keep):
            new = nxt.completion_ids[j][nxt.completion_mask[j].bool()].tolist()[:room[j]]
            tool_len = len(inputs[j]) - len(prompt_ids[i]) - len(completion[i])
            tool_mask[i] += [0] * tool_len + [1] * len(new)
            completion[i] = inputs[j][len(prompt_ids[i]):] + new
            if new:
                conversations[i].append(toolbox.parse(new, inputs[j], tools[i]))
                if conversations[i][-1].get("tool_calls"):
                    active.append(i)
        turn += 1

    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(max((len(c) for c in completion), default=1), 1)
    completion_ids = torch.full((n, width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((n, width), dtype=torch.long)
    tmask = torch.ones((n, width), dtype=torch.long)
    for i, c in enumerate(completion):
        completion_ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        completion_mask[i, :len(c)] = 1
        tmask[i, :len(c)] = torch.tensor(tool_mask[i], dtype=torch.long)
    truncated = torch.tensor([not c or c[-1] not in eos_ids for c in completion])
    p_ids, p_mask = left_pad(prompt_ids, pad_id)
    texts = tok.batch_decode(completion, skip_special_tokens=True)
    trace = AgentTrace(tmask, conversations, torch.tensor(calls), torch.tensor(failures), envs)
    return Rollout(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=completion_ids,
                   completion_mask=completion_mask, truncated=truncated, texts=texts, agent=trace)



def rollout_from_func(output: dict, tokenizer, *, conversational: bool, n: int, eos_ids: list[int],
                      where: str = "rollout_func"):
    """A :class:`~gtpo.sampling.rollout.Rollout` of ``n`` rows from what a TRL ``rollout_func`` returned: ``prompt_ids``
    and ``completion_ids`` (``n`` lists of ids each), ``logprobs`` (accepted, unused: gtpo's update recomputes the
    policy's log-probs), optionally ``env_mask`` (``n`` lists, 0 on environment tokens: TRL's ``tool_mask``), and any
    other key (``n`` values, or one for all) passed on to the reward functions as a keyword (TRL's ``extra_fields``).
    The completion mask covers each completion's whole length, as TRL's."""
    from .padding import left_pad
    from .rollout import Rollout

    if not isinstance(output, dict):
        raise ValueError(f"{where} must return a dict, got {type(output).__name__}")
    missing = sorted({"prompt_ids", "completion_ids", "logprobs"} - output.keys())
    if missing:
        raise ValueError(f"{where} must return keys {missing} in its output dict (TRL's contract)")
    prompts, completions = [list(map(int, p)) for p in output["prompt_ids"]], \
        [list(map(int, c)) for c in output["completion_ids"]]
    env_mask = output.get("env_mask")
    for key, value in (("prompt_ids", prompts), ("completion_ids", completions), ("env_mask", env_mask)):
        if value is not None and len(value) != n:
            raise ValueError(f"{where} returned {len(value)} {key} for {n} completions (one per prompt of the step, "
                             "group_size per dataset prompt, as TRL calls it)")
    if env_mask is not None and any(len(m) != len(c) for m, c in zip(env_mask, completions)):
        raise ValueError(f"{where}: each env_mask must have the length of its completion_ids")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(max((len(c) for c in completions), default=1), 1)
    completion_ids = torch.full((n, width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((n, width), dtype=torch.long)
    tool_mask = torch.ones((n, width), dtype=torch.long)
    for i, c in enumerate(completions):
        completion_ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        completion_mask[i, :len(c)] = 1
        if env_mask is not None:
            tool_mask[i, :len(c)] = torch.tensor([int(x != 0) for x in env_mask[i]], dtype=torch.long)
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    extra = {k: (v if isinstance(v, list) else [v] * n) for k, v in output.items()
             if k not in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
    conversations = [[{"role": "assistant", "content": t}] for t in texts] if conversational else None
    trace = AgentTrace(tool_mask, conversations, torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long),
                       fields=extra)
    p_ids, p_mask = left_pad(prompts, pad_id)
    truncated = torch.tensor([not c or c[-1] not in eos_ids for c in completions])
    return Rollout(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=completion_ids, completion_mask=completion_mask,
                   truncated=truncated, texts=texts, agent=trace)
