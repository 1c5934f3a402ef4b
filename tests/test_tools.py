"""Tool calling on gtpo's engine (issue 44 items 3, 5, 6): :mod:`gtpo.sampling.tools` and :class:`gtpo.GTPOTrainer`'s
``tools=`` / ``environment_factory=`` / ``rollout_func=`` (TRL's contracts), and ``configs/agents/calculator.yaml``
run as a user runs it.

Everything is real (the tokenizer's chat template with TRL's Qwen2.5 template, TRL's parser, the tools, the tiny
model's own turns after a tool result, GTPO's loss) except, where said, the model's FIRST turn: a random tiny model
never writes a tool call, so a test scripts that turn through the sampler the rollout takes as an argument (or the
trainer's ``_sample_turn``), as tests/test_trl_tools.py does on TRL's engine. The YAML journey needs no script: its
tiny model is first taught (a few steps of supervised training) to answer with a calculator call.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import pytest
import torch

pytest.importorskip("trl")

from gtpo import GTPOConfig  # noqa: E402
from gtpo.maths import method  # noqa: E402
from gtpo.maths.conflict import conflict_weights  # noqa: E402
from gtpo.sampling.rollout import Rollout, SamplingParams  # noqa: E402
from gtpo.sampling.tools import Toolbox, run_tool_call, tool_rollout  # noqa: E402
from gtpo.trainer import GTPOTrainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
G = 4
CALLS: list[tuple[str, tuple]] = []


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    CALLS.append(("add", (a, b)))
    return a + b


def boom(x: int) -> int:
    """A tool that always fails.

    Args:
        x: Any integer.
    """
    CALLS.append(("boom", (x,)))
    raise RuntimeError(f"boom on {x}")


def sleepy(x: int) -> int:
    """A tool that hangs.

    Args:
        x: Any integer.
    """
    CALLS.append(("sleepy", (x,)))
    time.sleep(30)
    return x


def no_docs(a: int) -> int:
    return a


class Calculator:
    """An environment (TRL's environment_factory): reset per rollout, its public methods are the tools."""

    def reset(self, **row) -> str | None:
        self.total, self.row = 0, row
        return f" (hint {row['answer']})"  # appended to the prompt's last message, as TRL does

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        CALLS.append(("env.add", (a, b)))
        self.total += a + b
        return a + b

    def get_reward(self) -> float:
        return float(self.total)


class NoReset:
    def add(self, a: int, b: int) -> int:
        """Add.

        Args:
            a: x.
            b: y.
        """
        return a + b


def call_text(name, **arguments):
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call><|im_end|>' % (name, json.dumps(arguments))


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """The tiny Qwen2 with TRL's Qwen2.5 chat template (renders tools; TRL knows its response format), on disk, with
    room for the tools' schemas in its context (2048 positions)."""
    import trl
    from transformers import AutoTokenizer

    from gtpo.testing import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny-qwen-tools"), arch="qwen2", eos_equals_pad=False, seed=1)
    tok = AutoTokenizer.from_pretrained(path)
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen2_5.jinja")) as fh:
        tok.chat_template = fh.read()
    tok.save_pretrained(path)
    config = json.load(open(os.path.join(path, "config.json")))
    config["max_position_embeddings"] = 2048
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    return path


@pytest.fixture(scope="module")
def tok(tool_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tool_model)


@pytest.fixture(scope="module")
def model(tool_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tool_model)


def scripted_sampler(tok, texts_of_turn, real=None):
    """``sample(prompt_ids, num_samples, sampling)`` for :func:`tool_rollout`: turn ``k`` (0-based, counted per call)
    answers row ``i`` with ``texts_of_turn(k, i)``, or, when that is None, with ``real``'s sampling."""
    from gtpo.sampling.padding import left_pad

    state = {"turn": 0}

    def sample(prompt_ids, num_samples, sampling):
        k = state["turn"]
        state["turn"] += 1
        rows = [ids for ids in prompt_ids for _ in range(num_samples)]
        texts = [texts_of_turn(k, i) for i in range(len(rows))]
        out = real(prompt_ids, num_samples, sampling) if real is not None and None in texts else None
        ids = [tok(t, add_special_tokens=False)["input_ids"] if t is not None else
               out.completion_ids[i][out.completion_mask[i].bool()].tolist() for i, t in enumerate(texts)]
        width = max(max(map(len, ids)), 1)
        comp = torch.full((len(ids), width), tok.pad_token_id)
        mask = torch.zeros_like(comp)
        for i, x in enumerate(ids):
            comp[i, :len(x)], mask[i, :len(x)] = torch.tensor(x, dtype=torch.long), 1
        p_ids, p_mask = left_pad(rows, tok.pad_token_id)
        return Rollout(p_ids, p_mask, comp, mask, torch.zeros(len(ids), dtype=torch.bool), tok.batch_decode(ids))

    return sample


PROMPTS = [[{"role": "user", "content": "What is 3+4?"}], [{"role": "user", "content": "What is 5+4?"}]]


def rollout(model, toolbox, sample, *, budget=400, turns=None, timeout=5.0, num_samples=2):
    return tool_rollout(model, toolbox, PROMPTS, [{}, {}], sampling=SamplingParams(max_new_tokens=budget),
                        num_samples=num_samples, max_iterations=turns, timeout=timeout,
                        eos_ids=[model.config.eos_token_id], sample=sample)


# ------------------------------------------------------------------------------------------------ the rollout
def test_tool_results_are_environment_tokens_and_errors_are_messages(tok, model):
    """Row 0 adds, row 1 calls a raising tool, row 2 a hanging one (timeout), row 3 an unknown tool; every row then
    answers. The tool turns are the chat template's tokens, masked 0; the model turns are 1; nothing crashes."""
    CALLS.clear()
    box = Toolbox(tok, [add, boom, sleepy])
    first = [call_text("add", a=3, b=4), call_text("boom", x=1), call_text("sleepy", x=2), call_text("nope", y=0)]
    started = time.perf_counter()
    out = rollout(model, box, scripted_sampler(tok, lambda k, i: first[i] if k == 0 else "done<|im_end|>"),
                  timeout=0.5)
    assert time.perf_counter() - started < 20  # the hanging tool was abandoned, not waited for
    trace = out.agent
    assert [c[1]["content"] for c in trace.conversations] == [
        "7", "{'error': 'boom on 1'}", "{'error': \"tool call 'sleepy' timed out after 0.5 s\"}",
        "{'error': 'Tool nope not found.'}"]
    assert trace.calls.tolist() == [1, 1, 1, 1] and trace.failures.tolist() == [0, 1, 1, 1]
    assert [c[2]["content"] for c in trace.conversations] == ["done"] * 4
    for i in range(4):
        n = int(out.completion_mask[i].sum())
        ids, tm = out.completion_ids[i, :n].tolist(), trace.tool_mask[i, :n].tolist()
        call = tok(first[i], add_special_tokens=False)["input_ids"]
        suffix = box.suffix_ids([trace.conversations[i][1]])
        done = tok("done<|im_end|>", add_special_tokens=False)["input_ids"]
        assert ids == call + suffix + done
        assert tm == [1] * len(call) + [0] * len(suffix) + [1] * len(done)
        assert "<tool_response>" in tok.decode(suffix) and not out.truncated[i]
    # the loss mask of the method has holes exactly there
    mask = method.loss_mask(out.completion_mask, out.truncated, mask_truncated_completions=False,
                            tool_mask=trace.tool_mask)
    assert torch.equal(mask, (out.completion_mask * trace.tool_mask).float())


def test_turn_limit_and_budget(tok, model):
    """A model that calls a tool at every turn: max_iterations turns of tools, then the completion ends on its last
    (unexecuted) call; with a budget too small for a tool result, the completion ends before it (TRL's rule)."""
    always = scripted_sampler(tok, lambda k, i: call_text("add", a=k, b=i))
    for limit in (0, 1, 3):
        CALLS.clear()
        out = rollout(model, Toolbox(tok, [add]), always, turns=limit)
        assert out.agent.calls.tolist() == [limit] * 4 and len(CALLS) == 4 * limit
        assert [len(c) for c in out.agent.conversations] == [1 + 2 * limit] * 4
        assert all(c[-1]["tool_calls"] for c in out.agent.conversations)
    call = len(tok(call_text("add", a=0, b=0), add_special_tokens=False)["input_ids"])
    out = rollout(model, Toolbox(tok, [add]), scripted_sampler(tok, lambda k, i: call_text("add", a=k, b=i)),
                  budget=call + 3, turns=5)
    assert [len(c) for c in out.agent.conversations] == [1] * 4  # the tool result did not fit: not appended
    assert out.completion_mask.sum(1).max() <= call + 3 and out.agent.tool_mask.bool().all()


def test_run_tool_call_timeout_and_async():
    async def slow_double(x: int) -> int:
        return 2 * x

    assert run_tool_call(slow_double, {"x": 4}, 5) == (8, False)
    result, failed = run_tool_call(sleepy, {"x": 1}, 0.2)
    assert failed and "timed out after 0.2 s" in result["error"]


# ------------------------------------------------------------------------------------------------ refusals
def test_bad_tools_are_refused_before_training(tok, tool_model, tmp_path):
    from datasets import Dataset

    from gtpo.testing import build_tiny_tokenizer

    with pytest.raises(ValueError, match=r"tools\[1\] 'no_docs'.*docstring"):
        Toolbox(tok, [add, no_docs])
    with pytest.raises(ValueError, match=r"environment_factory NoReset: .*reset"):
        Toolbox(tok, environment_factory=NoReset)
    with pytest.raises(ValueError, match="cannot render a tool call"):
        Toolbox(build_tiny_tokenizer(), [add])  # the plain ChatML template has no tools
    with pytest.raises(ValueError, match="use_vllm: gtpo's trainer runs tool-calling rollouts on its own sampler"):
        GTPOTrainer(tool_model, varied, conversational(), processing_class=tok, tools=[add],
                    args=GTPOConfig(output_dir=str(tmp_path), use_vllm=True))
    args = GTPOConfig(output_dir=str(tmp_path), max_steps=1, group_size=G, prompts_per_step=1)
    with pytest.raises(ValueError, match="tools need conversational prompts"):
        GTPOTrainer(tool_model, lambda completions, **k: [0.0] * len(completions),
                    Dataset.from_dict({"prompt": ["What is 3+4?"]}), args=args, processing_class=tok, tools=[add])


# ------------------------------------------------------------------------------------------------ the trainer
def varied(completions, **kwargs):
    """Varies within a group: a hash of the model's words (tool messages are not the model's)."""
    from gtpo.rewards import completion_text

    return [float(sum(map(ord, completion_text(c))) % 7) for c in completions]


TRAIN = dict(max_steps=2, group_size=G, prompts_per_step=2, max_completion_length=120, max_prompt_length=1024,
             save_steps=0, learning_rate=1e-3, log_completions_steps=1, entropy_filter=False, seed=0)


def conversational(n=4):
    return [{"prompt": [{"role": "user", "content": f"What is {i}+4?"}], "answer": str(i + 4)} for i in range(n)]


def script_first_turn(trainer, texts):
    """The trainer's first turn of each rollout answers row ``i`` with ``texts[i % len(texts)]`` (None: the model's
    own); later turns are the model's."""
    real, state = trainer._sample_turn, {"first": True}

    def sample(prompt_ids, num_samples, sampling):
        first, state["first"] = state["first"], False
        k = 0 if first else 1
        return scripted_sampler(trainer.tokenizer, lambda _, i: texts[i % len(texts)] if k == 0 else None,
                                real)(prompt_ids, num_samples, sampling)

    def rollout(rows):
        state["first"] = True
        return tool_rollout_of(rows)

    tool_rollout_of = trainer._tool_rollout
    trainer._tool_rollout = rollout
    trainer._sample_turn = sample


def record_inputs(trainer):
    seen, real = [], trainer.gtpo_inputs

    def wrapped(rollout, advantages):
        out = real(rollout, advantages)
        seen.append((rollout, advantages, out))
        return out

    trainer.gtpo_inputs = wrapped
    return seen


def test_trainer_trains_gtpo_over_model_tokens_with_tools(tool_model, tok, tmp_path):
    """tools=[add, boom, sleepy]: the tools run, a raising tool and a hanging one (tool_call_timeout) are messages,
    the run trains two steps; the loss mask the
    method gets is the completion mask with the tool tokens cut out, and GTPO's conflict weights are computed on it;
    the metrics and completions.jsonl record the calls and the conversations."""
    from test_metric_names import undocumented

    CALLS.clear()
    args = GTPOConfig(output_dir=str(tmp_path), max_tool_calling_iterations=2, tool_call_timeout=0.5,
                      **{**TRAIN, "max_prompt_length": 1400, "max_completion_length": 300})  # room for the errors
    trainer = GTPOTrainer(tool_model, varied, conversational(), args=args, processing_class=tok,
                          tools=[add, boom, sleepy])
    script_first_turn(trainer, [call_text("add", a=3, b=4), call_text("boom", x=1), call_text("sleepy", x=4),
                                "7<|im_end|>"])
    seen = record_inputs(trainer)
    metrics = trainer.train()
    assert trainer.global_step == 2 and torch.isfinite(torch.tensor(metrics["loss"]))
    assert ("add", (3, 4)) in CALLS and ("boom", (1,)) in CALLS
    assert metrics["tools/call_frequency"] >= 0.75 and 0 < metrics["tools/failure_frequency"] < 1
    assert metrics["tools/turns_mean"] > 1.5 and 0 < metrics["tools/env_token_frac"] < 1
    lines = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    assert not undocumented(set().union(*lines), "gtpo")
    holes = 0
    for rollout_, advantages, inputs in seen:
        tool = (rollout_.completion_mask != 0) & (rollout_.agent.tool_mask == 0)
        assert tool.any()
        expected = method.loss_mask(rollout_.completion_mask, rollout_.truncated, mask_truncated_completions=False,
                                    tool_mask=rollout_.agent.tool_mask)
        assert torch.equal(inputs.mask, expected) and (inputs.mask[tool] == 0).all()
        w, n = conflict_weights(rollout_.completion_ids, expected, advantages, G)
        assert torch.equal(inputs.token_weights, w) and torch.equal(inputs.n_conflict, n)
        holes += int((expected[:, 1:].bool() & ~expected[:, :-1].bool()).any(1).sum())
    assert holes > 0, "no completion had model tokens after a tool segment"
    # the training forward reads the tool tokens (out of the loss, not out of the context): its log-probs are the
    # model's on the whole conversation
    rollout_, _, inputs = seen[-1]
    with torch.no_grad():
        logp, _ = trainer.forward(rollout_, slice(0, len(rollout_.texts)), inputs.mask)
        ids = torch.cat([rollout_.prompt_ids, rollout_.completion_ids], 1)
        attention = torch.cat([rollout_.prompt_mask, rollout_.completion_mask], 1)
        logits = trainer.unwrapped_model(input_ids=ids, attention_mask=attention).logits
        logits = logits[:, rollout_.prompt_ids.shape[1] - 1:-1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, rollout_.completion_ids.unsqueeze(-1)).squeeze(-1)
    rows = rollout_.prompt_mask.bool().all(1)  # no left padding: the plain forward's positions are the same
    m = inputs.mask.bool() & rows.unsqueeze(1)
    assert m.sum() > 0
    torch.testing.assert_close(logp[m], ref[m], rtol=1e-4, atol=1e-4)
    records = [json.loads(x) for x in open(tmp_path / "completions.jsonl")]
    tools = [m for r in records for m in r["messages"] if m["role"] == "tool"]
    assert {"name": "add", "role": "tool", "content": "7"} in tools
    assert any(m["name"] == "boom" and "boom on 1" in m["content"] for m in tools)
    assert any(m["name"] == "sleepy" and "timed out after 0.5 s" in m["content"] for m in tools)


def test_environment_factory_and_its_reward(tool_model, tok, tmp_path):
    """environment_factory=Calculator: one instance per completion, reset with the dataset row, its methods the
    tools, its get_reward a reward function (named after the class) that sees the environments."""
    CALLS.clear()
    seen = []

    def reward(completions, environments, **kwargs):
        seen.append(environments)
        return [float(len(c)) for c in completions]

    args = GTPOConfig(output_dir=str(tmp_path), **{**TRAIN, "max_steps": 1})
    trainer = GTPOTrainer(tool_model, reward, conversational(), args=args, processing_class=tok,
                          environment_factory=Calculator)
    assert trainer.scorer.names == ["reward", "Calculator"]
    script_first_turn(trainer, [call_text("add", a=1, b=2), "no tool<|im_end|>"])
    inputs = record_inputs(trainer)
    metrics = trainer.train()
    prompts = tok.batch_decode(inputs[0][0].prompt_ids, skip_special_tokens=True)
    assert all(f"+4? (hint {e.row['answer']})" in p for p, e in zip(prompts, seen[0]))  # each row its own reset
    assert ("env.add", (1, 2)) in CALLS and len(seen[0]) == 2 * G and len({id(e) for e in seen[0]}) == 2 * G
    assert {e.row["answer"] for e in seen[0]} <= {str(i + 4) for i in range(4)}
    assert metrics["rewards/Calculator/mean"] == pytest.approx(1.5)  # half the completions added 1 + 2


def test_a_trl_rollout_func_runs_unchanged(tiny_model_path, tmp_path):
    """tests/test_trl_tools.py's rollout_func, written for TRL's engine, on gtpo's: its env_mask is the tool mask."""
    from datasets import Dataset
    from test_trl_tools import env_rollout

    data = Dataset.from_dict({"prompt": ["p0", "p1"] * 4})
    args = GTPOConfig(output_dir=str(tmp_path), **{**TRAIN, "max_prompt_length": 64})
    trainer = GTPOTrainer(tiny_model_path, lambda completion_ids, **k: [float(sum(x) % 5) for x in completion_ids],
                          data, args=args, rollout_func=env_rollout)
    seen = record_inputs(trainer)
    metrics = trainer.train()
    assert trainer.global_step == 2 and "tools/call_frequency" not in metrics and metrics["tools/turns_mean"] == 2
    for rollout_, advantages, inputs in seen:
        env = (rollout_.completion_ids >= 90) & (rollout_.completion_ids <= 92)
        assert env.any() and (inputs.mask[env] == 0).all() and (inputs.mask[~env & (rollout_.completion_mask == 1)] == 1).all()
        active = advantages != 0
        assert (inputs.n_conflict[active] >= 2).all()  # aligned over model tokens, whatever the env segment's length


# ------------------------------------------------------------------------------------------------ the YAML journey
def teach_the_calculator_call(path, prompts, steps=250):
    """A few steps of supervised training so the tiny model answers any prompt with a calculator call (the random
    model never writes one): then the YAML's run makes real tool calls with no scripting."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, os.path.join(ROOT, "configs", "agents"))
    try:
        from calculator_tools import calculator
    finally:
        sys.path.pop(0)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    target = tok(call_text("calculator", expression="1+2"), add_special_tokens=False)["input_ids"]
    rows = [tok.apply_chat_template(p, tools=[calculator], add_generation_prompt=True, tokenize=True,
                                    return_dict=False) for p in prompts]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for step in range(steps):
        prompt = rows[step % len(rows)]
        ids = torch.tensor([prompt + target])
        labels = ids.clone()
        labels[0, :len(prompt)] = -100
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(path)
    return float(loss.detach())


@pytest.mark.parametrize("engine", ["gtpo", "trl"])
def test_calculator_config_calls_the_tool(engine, tool_model, tmp_path, monkeypatch, capsys, tmp_path_factory):
    """``gtpo train configs/agents/calculator.yaml`` with the tiny model (taught to call the calculator) swapped in:
    the model calls the tool, the tool runs, the tool messages are in completions.jsonl (gtpo's engine) and the
    tools/* metrics are > 0 on both engines."""
    import shutil

    from gtpo.cli import main
    from gtpo.data import load_task

    model_dir = tmp_path_factory.getbasetemp() / "tiny-calculator"
    if not (model_dir / "taught").exists():
        shutil.copytree(tool_model, model_dir, dirs_exist_ok=True)
        prompts = [r["prompt"] for r in load_task("basic_arithmetic", split="train", size=8, template="paper")]
        assert teach_the_calculator_call(str(model_dir), prompts) < 0.2
        (model_dir / "taught").write_text("")
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    code = main(["train", "configs/agents/calculator.yaml", "--engine", engine, "--model", str(model_dir),
                 "--output_dir", str(out), "--max_steps", "1", "--group_size", "2", "--prompts_per_step", "2",
                 "--max_completion_length", "200", "--max_prompt_length", "1024", "--dataset.size", "4",
                 "--eval_dataset.size", "2", "--save_steps", "0", "--temperature", "0.5",
                 *(["--log_completions_steps", "1"] if engine == "gtpo" else
                   ["--use_cpu", "true", "--logging_steps", "1", "--report_to", "none", "--bf16", "false"])])
    assert code == 0, capsys.readouterr().out[-2000:]
    lines = [json.loads(x) for x in open(out / "metrics.jsonl")]
    record = next(r for r in lines if "tools/call_frequency" in r)
    assert record["tools/call_frequency"] > 0 and record["tools/env_token_frac"] > 0
    if engine == "gtpo":
        assert record["tools/turns_mean"] > 1
        messages = [m for r in map(json.loads, open(out / "completions.jsonl")) for m in r["messages"]]
        results = [m["content"] for m in messages if m["role"] == "tool" and m["name"] == "calculator"]
        assert results and all(r.lstrip("-").isdigit() or "error" in r for r in results), results


def test_dapo_dynamic_sampling_keeps_each_completion_its_tool_mask(tool_model, tok, tmp_path):
    """DAPO regroups the step's groups (ScoredBatch.group / concat): the tool masks, conversations and counts follow
    their completions, and the loss mask is still the completion mask without the tool tokens."""
    args = GTPOConfig(output_dir=str(tmp_path), loss_type="dapo", mask_truncated_completions=False,
                      **{**TRAIN, "max_steps": 1})
    trainer = GTPOTrainer(tool_model, varied, conversational(), args=args, processing_class=tok, tools=[add])
    script_first_turn(trainer, [call_text("add", a=3, b=4), "7<|im_end|>"])
    seen = record_inputs(trainer)
    trainer.train()
    rollout_, _, inputs = seen[0]
    agent = rollout_.agent
    assert agent.tool_mask.shape == rollout_.completion_ids.shape and len(agent.conversations) == 2 * G
    for i in range(2 * G):
        called = len(agent.conversations[i]) > 1
        assert int(agent.calls[i]) == called and bool((agent.tool_mask[i] * rollout_.completion_mask[i]).ne(
            rollout_.completion_mask[i]).any()) == called
        assert rollout_.texts[i].startswith("<tool_call>") == called
    assert torch.equal(inputs.mask, (rollout_.completion_mask * agent.tool_mask).float())


def test_a_yaml_with_a_bad_tool_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    """The YAML's tools are checked when they are imported: the error names the file, the key and the tool."""
    from gtpo.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_tools.py").write_text("def lookup(key):\n    return key\n")
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    (tmp_path / "run.yaml").write_text("model: no/such-model\ndataset: train.jsonl\nreward_funcs: [correctness]\n"
                                       "tools: [my_tools.py:lookup]\n")
    assert main(["train", "run.yaml"]) == 2
    err = capsys.readouterr().err
    assert "run.yaml: tools: tools[0] 'lookup'" in err and "docstring" in err, err
    (tmp_path / "run.yaml").write_text("model: no/such-model\ndataset: train.jsonl\nreward_funcs: [correctness]\n"
                                       "tools: [my_tools.py:missing]\n")
    assert main(["train", "run.yaml"]) == 2
    assert "run.yaml: tools[0]: 'my_tools.py:missing': 'my_tools.py' has no callable 'missing'; callables there: " \
           "['lookup']" in capsys.readouterr().err
