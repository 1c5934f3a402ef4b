"""GTPO's method inside gtpo's trainer, where a run could silently not train or train on the wrong signal:

1. a run whose entropy filter drops everything says so (warning, counts, summary, CLI), and zero-variance
   GRPO steps are counted;
2. sampling temperature and log-prob temperature are separate fields;
3. <H>_ini averages over completions that have tokens;
4. entropies frozen at the rollout policy over num_iterations; truncated completions masked out of the loss
   are no conflict partners; the dapo preset shapes overlong rewards.
(Checkpoints that load with ``weights_only=True``: tests/test_checkpoint.py; the command line's traps:
tests/test_cli_options.py.)
"""

import math
import os

import pytest
import torch

from gtpo import GTPOConfig, GTPOTrainer
from helpers import PROMPTS, digit_reward, rows
from helpers import tiny_config as config

# ----------------------------------------------------------------------------- 2. two temperatures
def _entropy_of_batch(model, rollout, temperature):
    """Mean token entropy (over the completion mask) of the full logits divided by ``temperature``."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    attn = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    t = rollout.completion_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -t - 1:-1].double()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    m = rollout.completion_mask.double()
    return float((ent * m).sum() / m.sum())


@pytest.mark.parametrize("logprob_temperature", [None, 1.0])
def test_logprob_temperature_is_separate_from_the_sampling_temperature(tiny_model_path, tmp_path,
                                                                      logprob_temperature):
    cfg = config(tmp_path, max_steps=1, temperature=0.3, logprob_temperature=logprob_temperature,
                 learning_rate=0.0, entropy_filter=False)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
    metrics = trainer.step()
    rollout = trainer.last_batch.rollout
    want = _entropy_of_batch(trainer.unwrapped_model, rollout, 0.3 if logprob_temperature is None else 1.0)
    other = _entropy_of_batch(trainer.unwrapped_model, rollout, 1.0 if logprob_temperature is None else 0.3)
    assert abs(metrics["entropy"] - want) < 1e-4
    assert abs(want - other) > 0.02 # the two temperatures give clearly different entropies


def test_official_preset_and_paper_configs_sample_at_0_9_with_raw_logprobs():
    from gtpo.app import load_yaml, split_spec

    official = GTPOConfig.from_preset("official")
    assert (official.temperature, official.logprob_temperature) == (0.9, 1.0)
    assert GTPOConfig().resolved_logprob_temperature == 1.0
    assert GTPOConfig(temperature=0.7).resolved_logprob_temperature == 0.7  # None: TRL's behaviour
    root = os.path.join(os.path.dirname(__file__), "..", "configs", "paper")
    names = sorted(os.listdir(root))
    assert len(names) == 8
    for name in names:
        _run, cfg = split_spec(load_yaml(os.path.join(root, name)), source=name)
        assert (cfg.temperature, cfg.logprob_temperature) == (0.9, 1.0), name
        if cfg.loss_type == "grpo":
            assert cfg.beta == 0.0, name  # the paper's GRPO baselines: no KL, no reference model


# ----------------------------------------------------------------------------- 1. silent no-training
def test_a_run_whose_filter_drops_everything_says_so(tiny_model_path, tmp_path, caplog, monkeypatch):
    import gtpo.run.diagnostics

    monkeypatch.setattr(gtpo.run.diagnostics, "FILTERED_WARNING_INTERVAL", 3)
    # GTPOConfig's filter defaults (fixed tau = 0.7) on a random model (entropy ~ ln 512 = 6.2 nats)
    cfg = config(tmp_path, max_steps=7, learning_rate=1e-2)
    assert cfg.resolved_entropy_filter and cfg.entropy_rule == "fixed" and cfg.entropy_threshold == 0.7
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
    before = {n: p.detach().clone() for n, p in trainer.unwrapped_model.named_parameters()}
    with caplog.at_level("WARNING", logger="gtpo"):
        metrics = trainer.train()
    after = dict(trainer.unwrapped_model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before)  # trained nothing ...
    assert trainer.no_signal.counts == {"filtered": 7, "zero_variance": 0, "masked": 0, "nonfinite": 0}
    assert metrics["gtpo/no_signal_steps"] == 7.0 and metrics["gtpo/no_signal/filtered"] == 7.0
    assert trainer.no_signal.summary() == "7 (filtered 7)"
    warnings = [r.getMessage() for r in caplog.records if "entropy filter dropped every completion" in r.getMessage()]
    assert len(warnings) == 3  # steps 1, 4, 7: repeated at an interval, not every step
    first = warnings[0]
    entropy = float(first.split("mean token entropy ")[1].split(" nats")[0])
    assert 5.0 < entropy < 6.3  # the measured mean entropy ...
    for needle in ("entropy_threshold 0.700", "entropy_rule: initial", "higher entropy_threshold",
                   "lower temperature"):
        assert needle in first  # ... the threshold, and what to change


def test_no_signal_counts_reach_the_summary_and_the_cli_prints_them(tiny_model_path, tmp_path, capsys):
    import json

    import yaml

    from gtpo.cli import main

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n"
                            for a in range(4)))
    spec = {"model": tiny_model_path, "dataset": {"name": str(data), "template": "plain"},
            "reward_funcs": ["last_number_correctness"], "output_dir": str(tmp_path / "out"), "group_size": 4,
            "prompts_per_step": 2, "max_steps": 3, "max_completion_length": 4, "save_steps": 0,
            "disable_tqdm": True}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path)]) == 0
    out = capsys.readouterr().out
    assert "3 (filtered 3) of 3 steps had no gradient signal" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["no_signal_steps"] == 3 and summary["no_signal_reasons"]["filtered"] == 3
    # a run with signal prints nothing of the kind
    assert main(["train", str(path), "--overwrite", "--entropy_filter", "false", "--gamma", "0.1"]) == 0
    assert "no gradient signal" not in capsys.readouterr().out


def test_zero_variance_steps_are_counted_for_grpo(tiny_model_path, tmp_path):
    cfg = config(tmp_path, loss_type="grpo", max_steps=2)
    trainer = GTPOTrainer(tiny_model_path, lambda completions, **kw: [1.0] * len(completions), rows(), args=cfg)
    trainer.train()
    assert trainer.no_signal.counts["zero_variance"] == 2


# ----------------------------------------------------------------------------- fixed rollouts
def _fixed_rollout(trainer, completions, truncated):
    """A Rollout of the first P dataset prompts with the given completion ids (G per prompt)."""
    from gtpo.sampling.rollout import Rollout, encode_prompts, left_pad

    g = trainer.args.group_size
    p = len(completions) // g
    tok = trainer.tokenizer
    prompt_ids, prompt_mask = left_pad([x for x in encode_prompts(tok, PROMPTS[:p]) for _ in range(g)],
                                       tok.pad_token_id)
    width = max(len(c) for c in completions)
    ids = torch.full((len(completions), width), tok.pad_token_id)
    mask = torch.zeros((len(completions), width), dtype=torch.long)
    for i, c in enumerate(completions):
        ids[i, :len(c)] = torch.tensor(c)
        mask[i, :len(c)] = 1
    return Rollout(prompt_ids, prompt_mask, ids, mask, torch.tensor(truncated),
                   [tok.decode(c) for c in completions])


def _spy_update(trainer, monkeypatch):
    """Record the keyword arguments of every loss call and the completion entropies every call of
    the advantage shaping got (``seq_entropy``), one dict per micro-batch and pass."""
    calls = []
    loss_fn, shape = trainer.loss_fn, trainer._effective_advantages

    def spy_shape(advantages, seq_entropy, inputs, index):
        calls.append({"seq_entropy": seq_entropy.detach().clone()})
        return shape(advantages, seq_entropy, inputs, index)

    def spy_loss(logp, old_logp, advantages, mask, extras, config):
        given = {"old_logp": old_logp, **extras._asdict()}
        calls[-1].update({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in given.items()})
        return loss_fn(logp, old_logp, advantages, mask, extras, config)

    monkeypatch.setattr(trainer, "_effective_advantages", spy_shape)
    monkeypatch.setattr(trainer, "loss_fn", spy_loss)
    return calls


# ----------------------------------------------------------------------------- 3. <H>_ini
def test_initial_entropy_averages_over_completions_that_have_tokens(tiny_model_path, tmp_path, monkeypatch):
    cfg = config(tmp_path, max_steps=1, group_size=4, prompts_per_step=1, mask_truncated_completions=True,
                 entropy_rule="initial", entropy_threshold=math.log(2), learning_rate=0.0)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
    eos = trainer.eos_ids[0]
    completions = [[5, 6, 7, eos], [8, 9, eos], [10, 11, 12, 13], [14, 15, 16, 17]]
    rollout = _fixed_rollout(trainer, completions, [False, False, True, True])  # 2 of 4 truncated
    monkeypatch.setattr(trainer, "sample_rollout", lambda rows: rollout)
    trainer.step()
    # reference: each completion's mean token entropy from the full logits, averaged over rows 0 and 1
    model = trainer.unwrapped_model
    per_row = []
    for i in range(4):
        t = len(completions[i])
        ids = torch.cat([rollout.prompt_ids[i][rollout.prompt_mask[i].bool()], rollout.completion_ids[i, :t]])
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0].double()
        logp = torch.log_softmax(logits[-t - 1:-1], -1)
        per_row.append(float(-(logp.exp() * logp).sum(-1).mean()))
    want = (per_row[0] + per_row[1]) / 2
    assert abs(trainer.initial_entropy - want) < 1e-4
    assert trainer.initial_entropy > 0.9 * min(per_row)  # not pulled towards 0 by the masked rows


# ----------------------------------------------------------------------------- 4. decisions
def test_entropies_for_filter_and_shift_are_frozen_at_the_rollout_policy(tiny_model_path, tmp_path, monkeypatch):
    cfg = config(tmp_path, max_steps=1, num_iterations=3, learning_rate=5e-2, entropy_filter=True,
                 entropy_threshold=100.0, gamma=0.1)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
    calls = _spy_update(trainer, monkeypatch)
    trainer.step()
    assert len(calls) == 3  # one micro-batch, three iterations
    first = calls[0]["seq_entropy"]
    for later in calls[1:]:
        assert torch.equal(later["seq_entropy"], first)  # the same tensor values: frozen, not recomputed
    # while the policy did move between iterations (the ratio is no longer 1)
    assert not torch.equal(calls[2]["old_logp"], torch.zeros_like(calls[2]["old_logp"]))


def test_truncated_completions_masked_out_are_no_conflict_partners(tiny_model_path, tmp_path, monkeypatch):

    def reward(completion_ids, **kw):  # row 0 positive, row 1 negative, rows 2-3 at the mean (inactive)
        return [{5: 1.0, 8: 0.0}.get(ids[0], 0.5) if ids[:2] != [5, 6] or ids[2] == 7 else 0.0
                for ids in completion_ids]

    def run(mask_truncated):
        cfg = config(tmp_path / str(mask_truncated), max_steps=1, group_size=4, prompts_per_step=1,
                     mask_truncated_completions=mask_truncated, entropy_filter=False, gamma=0.0)
        trainer = GTPOTrainer(tiny_model_path, reward, rows(), args=cfg)
        eos = trainer.eos_ids[0]
        # rows 0 and 1 share the prefix [5, 6]; row 1 is truncated (no EOS within the budget)
        completions = [[5, 6, 7, eos], [5, 6, 9, 10], [20, 21, eos], [22, 23, 24, eos]]
        rollout = _fixed_rollout(trainer, completions, [False, True, False, False])
        monkeypatch.setattr(trainer, "sample_rollout", lambda rows: rollout)
        calls = _spy_update(trainer, monkeypatch)
        trainer.step()
        return calls[0]["token_weights"]

    kept = run(False)
    assert kept[0, :2].tolist() == [2.0, 2.0] and kept[1, :2].tolist() == [0.0, 0.0]  # a conflict run
    masked = run(True)
    assert masked[0].tolist() == [1.0, 1.0, 1.0, 1.0]  # its partner gets no update: nothing to protect
    assert masked[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # outside the loss mask


def test_dapo_preset_shapes_overlong_rewards_scaled_to_the_budget(tiny_model_path, tmp_path):
    cfg = GTPOConfig.from_preset("dapo", max_completion_length=1000)
    assert (cfg.overlong_buffer_length, cfg.overlong_penalty_factor) == (200, 1.0)
    assert cfg.mask_truncated_completions and cfg.resolved_dynamic_sampling and cfg.resolved_epsilon_high == 0.28
    assert GTPOConfig.from_preset("dapo", max_completion_length=1000, overlong_buffer_length=50).overlong_buffer_length == 50
    # through the trainer: a completion at the budget loses the full factor
    cfg = GTPOConfig.from_preset("dapo", **{**dict(output_dir=str(tmp_path / "d"), group_size=4, prompts_per_step=2,
                                               max_steps=1, max_completion_length=5, save_steps=0,
                                               log_completions_steps=0, disable_tqdm=True, seed=0),
                                            "dynamic_sampling": False})
    assert cfg.overlong_buffer_length == 1
    trainer = GTPOTrainer(tiny_model_path, lambda completions, **kw: [0.0] * len(completions), rows(), args=cfg)
    trainer.step()
    batch = trainer.last_batch
    want = torch.where(batch.rollout.lengths >= 5, -1.0, 0.0)
    torch.testing.assert_close(batch.rewards, want)
