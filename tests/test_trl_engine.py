"""GTPO on TRL's engine (``gtpo.integrations.trl``): the config (one source of truth, presets, refusals), the
loss and gradient equal to gtpo's own trainer on a fixed batch, LoRA training with groups split over
micro-batches, two processes equal to one, the CLI (``gtpo train --engine trl``)."""

import dataclasses
import json
import os
import subprocess
import sys
import typing

import pytest
import torch

pytest.importorskip("trl")

from gtpo.maths.advantages import entropy_control, group_advantages  # noqa: E402
from gtpo.config import GTPOConfig  # noqa: E402
from gtpo.maths.conflict import conflict_weights  # noqa: E402
from gtpo.errors import ConfigError, ConfigValueError  # noqa: E402
from gtpo.integrations.trl import (  # noqa: E402
    ENGINE_ONLY, GTPO_METHOD_FIELDS, RENAMED, UNAVAILABLE, TRLGTPOConfig, TRLGTPOTrainer,
)
from gtpo.maths.losses import gtpo_loss  # noqa: E402
from gtpo.maths.ops import masked_mean  # noqa: E402
from helpers import free_port  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "trl_ddp_train.py")
TRAINING = dict(use_cpu=True, report_to="none", bf16=False, gradient_checkpointing=False, save_strategy="no",
                disable_tqdm=True, seed=0)

# A fixed batch: 2 prompts x 4 completions with shared prefixes / suffixes across signs (conflict runs),
# different lengths, EOS (id 2 = pad in the tiny tokenizer) at the end, one truncated completion (no EOS).
G, P, EOS = 4, 2, 2
PROMPT_IDS = {"p0": [30, 31, 32], "p1": [33, 34]}
C = [
    [10, 11, 12, 40, 41, EOS], [10, 11, 13, 42, EOS], [10, 11, 12, 43, 44, 45, 46, EOS], [10, 50, 41, EOS],
    [20, 21, 22, 23, EOS], [20, 21, 60, 61, 62, 23, EOS], [20, 70, 71, 72, 73, 74, 75, 76], [21, 21, 22, 23, EOS],
]
R = [2.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 3.0]
ROW = {tuple(c): i for i, c in enumerate(C)}


def fixed_rollout(prompts, trainer):
    """TRL's rollout_func: the fixed completions of the local rows (prompt p repeated G times)."""
    rank, n = trainer.accelerator.process_index, len(prompts)
    rows = range(rank * n, (rank + 1) * n)
    return {"prompt_ids": [PROMPT_IDS[prompts[k]] for k in range(n)], "completion_ids": [list(C[i]) for i in rows],
            "logprobs": None}


def fixed_reward(completion_ids, **kwargs):
    return [R[ROW[tuple(c)]] for c in completion_ids]


def fixed_tensors():
    """The fixed batch as gtpo's Rollout tensors: prompts left padded, completions right padded (pad = EOS)."""
    from gtpo.sampling.padding import completion_mask_from_ids, left_pad

    prompts = [PROMPT_IDS[f"p{i // G}"] for i in range(P * G)]
    prompt_ids, prompt_mask = left_pad(prompts, EOS)
    T = max(len(c) for c in C)
    completion_ids = torch.tensor([c + [EOS] * (T - len(c)) for c in C])
    completion_mask, truncated = completion_mask_from_ids(completion_ids, [EOS])
    return prompt_ids, prompt_mask, completion_ids, completion_mask, truncated


def direct_logp_entropy(model, temperature, mask=None):
    """``logp (N, T)``, ``entropy (N, T)`` of the fixed completions, plain log_softmax of the full logits."""
    prompt_ids, prompt_mask, completion_ids, completion_mask, _ = fixed_tensors()
    mask = completion_mask if mask is None else mask
    ids = torch.cat([prompt_ids, completion_ids], 1)
    attn = torch.cat([prompt_mask, mask], 1)
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)
    T = completion_ids.size(1)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits[:, -T - 1:-1].float()
    logp_all = (logits / temperature).log_softmax(-1)
    logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def separating_threshold(seq_entropy, away_from=None):
    """A threshold between two of the completions' entropies (so the filter drops some and keeps some), at
    least 1e-5 from every entropy and from ``away_from`` (<H>_ini): engines that agree to 1e-6 filter alike.
    (A random model's completion entropies all lie within ~1e-3 of ln V.)"""
    values = sorted(seq_entropy.tolist())
    mids = [(a + b) / 2 for a, b in zip(values[1:-2], values[2:-1]) if b - a > 2e-5]
    for mid in sorted(mids, key=lambda m: -min(abs(m - v) for v in values)):
        if away_from is None or abs(mid - away_from) > 1e-5:
            return mid
    pytest.skip("the random model's completion entropies are too close together to separate")


def trl_trainer(model_path, out, *, spg=4, ga=4, preset=None, **kwargs):
    values = dict(TRAINING, output_dir=str(out), per_device_train_batch_size=2, gradient_accumulation_steps=ga,
                  steps_per_generation=spg, num_generations=G, max_completion_length=16, **kwargs)
    args = TRLGTPOConfig.from_preset(preset, **values) if preset else TRLGTPOConfig(**values)
    from datasets import Dataset

    data = Dataset.from_dict({"prompt": ["p0", "p1"] * 4})
    return TRLGTPOTrainer(model=model_path, reward_funcs=fixed_reward, args=args, train_dataset=data,
                          rollout_func=fixed_rollout)


def trl_step_grads(trainer, ga, *, first_step=0):
    """The loss and gradients of one optimizer step of TRL's loop on the fixed batch: `_prepare_inputs`
    (generate, shuffle, split into steps_per_generation micro-batches), `compute_loss`, backward, over
    `ga` micro-batches. Returns (loss, {name: grad}, the micro-batches)."""
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = ga
    model.zero_grad(set_to_none=True)
    inputs = [{"prompt": f"p{i // G}"} for i in range(P * G)]
    total, batches = 0.0, []
    for k in range(first_step * ga, (first_step + 1) * ga):
        trainer._step = k
        batch = trainer._prepare_inputs(inputs)
        loss = trainer.compute_loss(model, batch)
        loss.backward()
        total += float(loss)
        batches.append(batch)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return total, grads, batches


def max_diff(a, b):
    assert set(a) == set(b)
    return max(float((a[n] - b[n]).abs().max()) for n in a)


# ----------------------------------------------------------------------------------------- config
def test_every_gtpo_method_field_is_present_with_gtpo_default_and_help():
    gtpo_fields = {f.name: f for f in dataclasses.fields(GTPOConfig)}
    trl_fields = {f.name: f for f in dataclasses.fields(TRLGTPOConfig)}
    hints, gtpo_hints = typing.get_type_hints(TRLGTPOConfig), typing.get_type_hints(GTPOConfig)
    assert len(GTPO_METHOD_FIELDS) >= 17
    for name in GTPO_METHOD_FIELDS:
        assert name in trl_fields, name
        assert trl_fields[name].default == gtpo_fields[name].default, name
        assert trl_fields[name].metadata["help"] == gtpo_fields[name].metadata["help"], name
        assert hints[name] == gtpo_hints[name], name
        assert name in TRLGTPOConfig.__doc__, name  # TRL-style entry in the docstring
    # every GTPOConfig field has a decision: TRL's own field, a GTPO method field, renamed, engine-only, unavailable
    from trl import GRPOConfig

    trl_names = {f.name for f in dataclasses.fields(GRPOConfig)}
    for name in gtpo_fields:
        assert (name in trl_names) + (name in GTPO_METHOD_FIELDS) + (name in RENAMED) + (name in UNAVAILABLE) \
            + (name in ENGINE_ONLY and name not in trl_names) == 1, name


def test_defaults_and_refusals(tmp_path):
    args = TRLGTPOConfig(output_dir=str(tmp_path), use_cpu=True)
    assert args.loss_type == "gtpo" and args.scale_rewards == "none" and args.beta == 0.0
    assert args.vllm_importance_sampling_correction is True  # TRL's default when temperatures agree
    assert TRLGTPOConfig(output_dir=str(tmp_path), use_cpu=True, loss_type="dapo").scale_rewards == "group"
    refused = [
        (dict(beta=0.04), "beta"), (dict(importance_sampling_level="sequence"), "importance_sampling_level"),
        (dict(delta=2.0), "delta"), (dict(multi_objective_aggregation="normalize_then_sum"), "multi_objective_aggregation"),
        (dict(entropy_coef=0.01), "entropy_coef"), (dict(conflict_combine="sum"), "conflict_combine"),
        (dict(entropy_rule="paper"), "entropy_rule"), (dict(num_generations=4, pos_weight=float("inf")), "pos_weight"),
        (dict(loss_type="grpo", conflict_masks=True), "conflict_masks"),
        (dict(loss_type="dapo", entropy_filter=True), "entropy_filter"),
        (dict(use_vllm=True, vllm_importance_sampling_correction=True, temperature=0.9, logprob_temperature=1.0),
         "vllm_importance_sampling_correction"),
    ]
    for kwargs, name in refused:
        with pytest.raises(ConfigValueError, match=rf"TRLGTPOConfig\.{name}") as err:
            TRLGTPOConfig(output_dir=str(tmp_path), use_cpu=True, **kwargs)
        assert err.value.field == name
    # the official preset samples at 0.9 and trains on the raw logits: vLLM's IS correction resolves off
    assert TRLGTPOConfig.from_preset("official", output_dir=str(tmp_path), use_cpu=True,
                                     use_vllm=True).vllm_importance_sampling_correction is False
    with pytest.raises(ConfigValueError, match="dynamic_sampling=False"):
        TRLGTPOConfig.from_preset("dapo", output_dir=str(tmp_path), use_cpu=True)
    dapo = TRLGTPOConfig.from_preset("dapo", output_dir=str(tmp_path), use_cpu=True, dynamic_sampling=False)
    assert (dapo.loss_type, dapo.epsilon_high, dapo.mask_truncated_completions) == ("dapo", 0.28, True)
    assert dapo.overlong_buffer_length == dapo.max_completion_length // 5
    # gtpo's name of num_generations is an alias here too (tests/test_trl_yaml.py)
    assert TRLGTPOConfig.from_preset("official", output_dir=str(tmp_path), use_cpu=True, group_size=4,
                                     per_device_train_batch_size=4).num_generations == 4


@pytest.mark.parametrize("preset", ["official", "paper"])
def test_presets_reach_trl_unchanged(preset, tiny_model_path, tmp_path):
    values = GTPOConfig.preset_values(preset)
    args = TRLGTPOConfig.from_preset(preset, output_dir=str(tmp_path), num_generations=4,
                                     per_device_train_batch_size=4, **TRAINING)
    for name, value in values.items():
        assert getattr(args, name) == value, name
    # the trainer runs with them: GTPO's config, TRL's sampling temperature, log-probs at logprob_temperature
    from datasets import Dataset

    trainer = TRLGTPOTrainer(model=tiny_model_path, reward_funcs=fixed_reward, args=args,
                             train_dataset=Dataset.from_dict({"prompt": ["p0", "p1"]}), rollout_func=fixed_rollout)
    cfg = trainer.gtpo_config
    for name, value in values.items():
        assert getattr(cfg, name) == value, name
    assert trainer.temperature == values.get("temperature", 1.0)
    prompt_ids, prompt_mask, completion_ids, completion_mask, _ = fixed_tensors()
    with torch.no_grad():
        logp, ent, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1),
            completion_ids.size(1), compute_entropy=True)
        ref_logp, ref_ent = direct_logp_entropy(trainer.model, cfg.resolved_logprob_temperature)
    m = completion_mask.bool()
    assert torch.allclose(logp[m], ref_logp[m], atol=1e-5) and torch.allclose(ent[m], ref_ent[m], atol=1e-5)
    # the same preset through the CLI's mapping (GTPOConfig -> TRL) reaches TRL unchanged too
    mapped = TRLGTPOConfig.from_gtpo_config(GTPOConfig.from_preset(preset, group_size=4, prompts_per_step=2),
                                            use_cpu=True)
    for name, value in values.items():
        assert getattr(mapped, name) == value, name
    assert (mapped.num_generations, mapped.per_device_train_batch_size, mapped.steps_per_generation) == (4, 8, 1)


def test_from_gtpo_config_maps_the_batch_and_the_loss_types(tmp_path):
    cfg = GTPOConfig(output_dir=str(tmp_path), group_size=4, prompts_per_step=4, micro_batch_size=2, max_steps=10,
                     num_iterations=2, warmup_ratio=0.1, save_steps=5, lr_scheduler_type="cosine")
    args = TRLGTPOConfig.from_gtpo_config(cfg, num_processes=2, use_cpu=True)
    assert (args.num_generations, args.per_device_train_batch_size, args.gradient_accumulation_steps,
            args.steps_per_generation) == (4, 2, 4, 4)  # 16 completions, 8 per process, micro-batches of 2
    assert (args.max_steps, args.save_steps, args.warmup_steps, args.bf16, args.gradient_checkpointing) == \
        (20, 10, 2, False, False)  # rollout steps x num_iterations = optimizer steps
    for loss_type, aggregation, trl_type in [("grpo", None, "grpo"), ("dr_grpo", None, "dr_grpo"),
                                             ("grpo", "token_mean", "dapo"), ("dapo", "constant", "dr_grpo")]:
        base = GTPOConfig(output_dir=str(tmp_path), loss_type=loss_type, loss_aggregation=aggregation,
                          dynamic_sampling=False, group_size=4)
        assert TRLGTPOConfig.from_gtpo_config(base, use_cpu=True).loss_type == trl_type
    with pytest.raises(ConfigValueError, match="dynamic_sampling"):
        TRLGTPOConfig.from_gtpo_config(GTPOConfig.from_preset("dapo", group_size=4), use_cpu=True)
    with pytest.raises(ConfigValueError, match="micro_batch_size"):
        TRLGTPOConfig.from_gtpo_config(cfg.replace(micro_batch_size=3), use_cpu=True)
    with pytest.raises(ConfigValueError, match="not both"):
        TRLGTPOConfig.from_gtpo_config(cfg, set_fields={"prompts_per_step"}, per_device_train_batch_size=4,
                                       use_cpu=True)
    with pytest.raises(ConfigValueError, match="not both"):  # prompts_per_step=4 differs from the default
        TRLGTPOConfig.from_gtpo_config(cfg, per_device_train_batch_size=4, use_cpu=True)
    own = TRLGTPOConfig.from_gtpo_config(GTPOConfig(group_size=4), per_device_train_batch_size=4,
                                         gradient_accumulation_steps=2, use_cpu=True)  # TRL's batch, gtpo's defaults
    assert (own.per_device_train_batch_size, own.steps_per_generation) == (4, 2)
    with pytest.raises(ConfigValueError, match="an ablation of gtpo's own trainer"):  # allowed there, not on TRL's
        TRLGTPOConfig.from_gtpo_config(GTPOConfig(loss_type="grpo", conflict_masks=True, gtpo_ablation=True,
                                                  group_size=4), use_cpu=True)


def test_trl_parser_reads_gtpo_fields(tmp_path):
    """TRL's own command-line / YAML parser (TrlParser) takes TRLGTPOConfig, GTPO's fields included."""
    from trl import TrlParser

    parser = TrlParser((TRLGTPOConfig,))
    (args,) = parser.parse_args_and_config([
        "--output_dir", str(tmp_path), "--use_cpu", "--bf16", "false", "--pos_weight", "3", "--entropy_rule", "initial",
        "--divide_by_conflict_count", "false", "--num_generations", "4", "--per_device_train_batch_size", "4",
        "--gamma", "0.05"])
    assert (args.loss_type, args.scale_rewards, args.pos_weight, args.entropy_rule, args.divide_by_conflict_count,
            args.gamma, args.entropy_filter) == ("gtpo", "none", 3.0, "initial", False, 0.05, None)
    with pytest.raises(ValueError, match="TRLGTPOConfig.conflict_combine"):
        parser.parse_args_and_config(["--output_dir", str(tmp_path), "--use_cpu", "--conflict_combine", "sum"])


def test_importing_gtpo_needs_no_trl():
    code = ("import sys; import gtpo, gtpo.integrations, gtpo.cli; from gtpo import GTPOConfig; "
            "print('trl' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


# ----------------------------------------------------------------------- (a) equal to gtpo's trainer
CASES = {
    "official": dict(preset="official"),
    "paper": dict(preset="paper"),
    "ablations": dict(fields=dict(conflict_combine="union", conflict_count="union", completion_sign="positive",
                                  gamma_groups="varying", mask_truncated_completions=True, scale_rewards="group",
                                  temperature=0.7, gamma=0.05)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_and_gradient_equal_gtpo_trainer(case, tiny_model_path, tmp_path):
    """The same batch (prompts, completions, rewards) through gtpo's trainer (gtpo_inputs + update) and through
    TRL's loop (generation output, shuffle, split into 4 micro-batches, gradient accumulation): the same loss
    and gradient to 1e-6, with the entropy filter dropping some completions."""
    from gtpo import GTPOTrainer
    from gtpo.sampling.rollout import Rollout

    spec = CASES[case]
    fields = dict(spec.get("fields", {}))
    base = GTPOConfig.from_preset(spec["preset"]) if "preset" in spec else GTPOConfig(**fields)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    mask_for_entropy = None
    prompt_ids, prompt_mask, completion_ids, completion_mask, truncated = fixed_tensors()
    loss_mask = completion_mask.clone()
    if base.mask_truncated_completions:
        loss_mask[truncated] = 0
        mask_for_entropy = loss_mask
    with torch.no_grad():
        _, ent = direct_logp_entropy(model, base.resolved_logprob_temperature, mask_for_entropy)
    seq_entropy = masked_mean(ent, loss_mask, dim=1)
    initial = float(seq_entropy[loss_mask.sum(1) > 0].mean()) if base.entropy_rule == "initial" else None
    fields["entropy_threshold"] = separating_threshold(seq_entropy[loss_mask.sum(1) > 0], away_from=initial)

    # gtpo's own trainer
    gtpo_cfg = (GTPOConfig.from_preset(spec["preset"], **fields) if "preset" in spec else GTPOConfig(**fields)).replace(
        output_dir=str(tmp_path / "gtpo"), group_size=G, prompts_per_step=P, micro_batch_size=2, max_grad_norm=0.0,
        disable_tqdm=True, log_completions_steps=0, save_steps=0)
    ours = GTPOTrainer(tiny_model_path, fixed_reward, [{"prompt": "p0"}, {"prompt": "p1"}], args=gtpo_cfg)
    rollout = Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, [""] * len(C))
    advantages = group_advantages(torch.tensor(R), G, scale=gtpo_cfg.resolved_scale_rewards)
    inputs = ours.gtpo_inputs(rollout, advantages)
    captured = {}
    ours.optimizer.step = lambda *a, **k: captured.update(
        {n: p.grad.detach().clone() for n, p in ours.unwrapped_model.named_parameters() if p.grad is not None})
    result = ours.update(rollout, advantages, inputs)
    assert result.skipped_updates == 0 and captured

    # TRL's engine, the same fields
    trainer = trl_trainer(tiny_model_path, tmp_path / "trl", preset=spec.get("preset"), **fields)
    loss, grads, batches = trl_step_grads(trainer, ga=4)
    dropped = 0 < int((seq_entropy > fields["entropy_threshold"]).sum()) < len(C)
    assert dropped or base.entropy_rule == "initial"
    if initial is not None:
        assert trainer.gtpo_initial_entropy == pytest.approx(ours.initial_entropy, abs=1e-6)
        assert ours.initial_entropy == pytest.approx(initial, abs=1e-5)
    # the GTPO inputs travelled with their rows through TRL's shuffle and split
    rows = [ROW[tuple(ids[m.bool()].tolist())] if m.any() else None
            for b in batches for ids, m in zip(b["completion_ids"], b["completion_mask"])]
    assert sorted(r for r in rows if r is not None) == [i for i in range(len(C)) if loss_mask[i].any()]
    if inputs.token_weights is not None:
        for b in batches:
            for ids, m, w, n in zip(b["completion_ids"], b["completion_mask"], b["gtpo_token_weights"],
                                    b["gtpo_n_conflict"]):
                if m.any():
                    i = ROW[tuple(ids[m.bool()].tolist())]
                    T = w.shape[0]
                    assert torch.equal(w, inputs.token_weights[i, :T]) and int(n) == int(inputs.n_conflict[i])
    assert loss == pytest.approx(float(result.loss), abs=1e-6)
    scale = max(1.0, max(float(g.abs().max()) for g in captured.values()))
    assert max_diff(grads, captured) < 1e-6 * scale, (max_diff(grads, captured), scale)


def test_two_optimizer_steps_per_generation_use_rollout_entropies_and_logprobs(tiny_model_path, tmp_path):
    """steps_per_generation = 2 x gradient_accumulation_steps: the second optimizer step of a generation batch
    runs on an updated policy. Its gradient equals the pure functions' with the rollout policy's entropies
    (captured from TRL's rollout log-prob forward, no extra forward) and the rollout log-probs as old_logp."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    prompt_ids, prompt_mask, completion_ids, mask, _ = fixed_tensors()
    with torch.no_grad():
        old_logp, ent = direct_logp_entropy(reference, 1.0)
    seq_entropy = masked_mean(ent, mask, dim=1)
    trainer = trl_trainer(tiny_model_path, tmp_path, spg=4, ga=2, entropy_threshold=separating_threshold(seq_entropy))
    cfg = trainer.gtpo_config
    _, grads1, batches1 = trl_step_grads(trainer, ga=2, first_step=0)
    assert "old_per_token_logps" in batches1[0] and "gtpo_seq_entropy" in batches1[0]
    with torch.no_grad():  # an SGD step on both models
        for (_, p), (_, q) in zip(trainer.model.named_parameters(), reference.named_parameters()):
            p -= 0.05 * p.grad
            q -= 0.05 * p.grad
    _, grads2, batches2 = trl_step_grads(trainer, ga=2, first_step=1)
    rows = [ROW[tuple(ids[m.bool()].tolist())] for b in batches2 for ids, m in zip(b["completion_ids"],
                                                                                     b["completion_mask"])]
    advantages = group_advantages(torch.tensor(R), G, scale="none")
    weights, n_conflict = conflict_weights(completion_ids, mask, advantages, G, **cfg.conflict_kwargs())
    reference.zero_grad(set_to_none=True)
    logp, _ = direct_logp_entropy(reference, cfg.resolved_logprob_temperature)
    effective, keep = entropy_control(advantages, seq_entropy, **cfg.shaping_kwargs())
    assert 0 < int(keep.sum()) < len(C)
    out = gtpo_loss(logp[rows], mask[rows], effective[rows], token_weights=weights[rows], n_conflict=n_conflict[rows],
                    old_logp=old_logp[rows], eps_low=0.2, eps_high=0.2, completion_reduction="mean",
                    num_sequences=len(rows))
    (out.loss * G).backward()  # completion_reduction "sum" = G x "mean" of the step's completions
    direct = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert max_diff(grads2, direct) < 1e-6 * max(1.0, max(float(g.abs().max()) for g in direct.values()))


def test_trl_loss_types_pass_through_unchanged(tiny_model_path, tmp_path):
    """loss_type "grpo" on TRLGTPOTrainer is TRL's GRPOTrainer: the same loss and gradient on the same batch."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    values = dict(TRAINING, per_device_train_batch_size=2, gradient_accumulation_steps=4, steps_per_generation=4,
                  num_generations=G, max_completion_length=16, loss_type="grpo", scale_rewards="group")
    data = Dataset.from_dict({"prompt": ["p0", "p1"] * 4})
    results = []
    for config_cls, trainer_cls in ((TRLGTPOConfig, TRLGTPOTrainer), (GRPOConfig, GRPOTrainer)):
        args = config_cls(output_dir=str(tmp_path / config_cls.__name__), **values)
        trainer = trainer_cls(model=tiny_model_path, reward_funcs=fixed_reward, args=args, train_dataset=data,
                              rollout_func=fixed_rollout)
        torch.manual_seed(0)  # TRL's shuffle of the generation batch
        results.append(trl_step_grads(trainer, ga=4)[:2])
    (loss, grads), (trl_loss, trl_grads) = results
    assert loss == trl_loss and max_diff(grads, trl_grads) == 0.0


def test_overlong_penalty_is_a_reward_function(tiny_model_path, tmp_path):
    """DAPO's soft overlong punishment (overlong_buffer_length > 0) is appended to the reward functions with
    weight 1: gtpo.rewards.scoring.overlong_penalty of each completion's length (first EOS included)."""
    from datasets import Dataset

    args = TRLGTPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=G,
                         max_completion_length=8, overlong_buffer_length=4, overlong_penalty_factor=2.0,
                         reward_weights=[0.5], **TRAINING)
    trainer = TRLGTPOTrainer(model=tiny_model_path, reward_funcs=fixed_reward, args=args,
                             train_dataset=Dataset.from_dict({"prompt": ["p0", "p1"]}), rollout_func=fixed_rollout)
    assert trainer.reward_func_names == ["fixed_reward", "overlong_penalty"]
    assert trainer.reward_weights.tolist() == [0.5, 1.0] and args.reward_weights == [0.5]  # args not mutated
    penalty = trainer.reward_funcs[-1]([c for c in C])
    assert penalty == [-(max(len(c) - 4, 0) / 4) * 2.0 for c in C]


def test_trl_per_token_multipliers_multiply_the_conflict_weights(tiny_model_path, tmp_path):
    """vLLM's importance-sampling ratio (token or sequence level) and the off-policy mask multiply lambda in
    GTPO's loss (simulated: no vLLM on CPU); gtpo/weighted_token_frac still counts lambda != 1 only."""
    trainer = trl_trainer(tiny_model_path, tmp_path, entropy_threshold=100.0)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions([{"prompt": f"p{i // G}"} for i in range(P * G)])
    mask = batch["completion_mask"]
    torch.manual_seed(0)
    for shape in [mask.shape, (mask.shape[0], 1)]:
        ratio = torch.rand(shape) + 0.5
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
        trainer.off_policy_mask_threshold = None
        loss = trainer.compute_loss(trainer.model, {**batch, "importance_sampling_ratio": ratio})
        trainer.use_vllm = False
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            torch.cat([batch["prompt_mask"], mask], 1), mask.size(1))
        effective, _ = entropy_control(batch["advantages"], batch["gtpo_seq_entropy"] if "gtpo_seq_entropy" in batch
                                       else masked_mean(_entropies(trainer, batch), mask, dim=1),
                                       **trainer.gtpo_config.shaping_kwargs())
        expected = gtpo_loss(logp, mask, effective, token_weights=batch["gtpo_token_weights"] * ratio,
                             n_conflict=batch["gtpo_n_conflict"], completion_reduction="mean",
                             num_sequences=mask.shape[0]).loss * G
        assert float(loss) == pytest.approx(float(expected), abs=1e-6)
    assert trainer._metrics["train"]["gtpo/weighted_token_frac"][-1] == pytest.approx(
        float(((batch["gtpo_token_weights"] != 1).float() * mask).sum() / mask.sum()))
    # the off-policy sequence mask: negative-advantage completions far from the sampling policy are dropped
    trainer.off_policy_mask_threshold = 0.5
    far = {**batch, "sampling_per_token_logps": torch.zeros_like(mask, dtype=torch.float32)}  # KL >> 0.5
    loss_masked = trainer.compute_loss(trainer.model, far)
    keep = (batch["advantages"] >= 0).float()[:, None]
    expected = gtpo_loss(logp, mask, effective, token_weights=batch["gtpo_token_weights"] * keep,
                         n_conflict=batch["gtpo_n_conflict"], completion_reduction="mean",
                         num_sequences=mask.shape[0]).loss * G
    assert float(loss_masked) == pytest.approx(float(expected), abs=1e-6)


def _entropies(trainer, batch):
    with torch.no_grad():
        return trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1), batch["completion_ids"].size(1),
            compute_entropy=True)[1]


# ---------------------------------------------------------------------- (b) LoRA, split groups
def test_lora_training_with_groups_split_over_micro_batches(tiny_model_path, tmp_path):
    from datasets import Dataset
    from peft import LoraConfig

    def reward_len(completions, **kwargs):  # varies within a group
        return [float(len(c) % 3) for c in completions]

    args = TRLGTPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2,
                         steps_per_generation=4, num_generations=4, max_completion_length=8, max_steps=4,
                         logging_steps=1, learning_rate=5e-3, entropy_threshold=100.0, num_iterations=2,
                         temperature=0.7, logprob_temperature=1.0, eval_strategy="steps", eval_steps=4,
                         per_device_eval_batch_size=4, num_generations_eval=2,
                         **{**TRAINING, "save_strategy": "steps"}, save_steps=2)
    data = Dataset.from_dict({"prompt": [f"What is {i} + {i + 1}?" for i in range(16)]})
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = TRLGTPOTrainer(model=tiny_model_path, reward_funcs=reward_len, args=args, train_dataset=data,
                             eval_dataset=data.select(range(2)), peft_config=lora)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert before and all("lora" in n for n in before)
    trainer.train()
    after = dict(trainer.model.named_parameters())
    unchanged = [n for n, p in before.items() if torch.equal(p, after[n])]
    assert not unchanged, unchanged
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 4
    for key in ("entropy", "gtpo/filtered_frac", "gtpo/adv_shift_mean", "gtpo/weighted_token_frac",
                "clip_ratio/region_mean"):
        assert all(key in h for h in logs), key
    assert all(h["gtpo/filtered_frac"] == 0.0 and h["entropy"] > 5 for h in logs)  # random model: ~6 nats
    assert "gtpo/conflict_frac" in logs[0] and "gtpo/n_conflict_mean" in logs[0]
    assert os.path.isfile(tmp_path / "checkpoint-2" / "gtpo_state.json")
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]  # TRL's evaluation, GTPO's loss (G = 2)
    assert len(evals) == 1 and "eval_gtpo/filtered_frac" in evals[0] and "eval_gtpo/conflict_frac" in evals[0]
    # log-probs and entropies of the PEFT model at logprob_temperature (1.0), not the sampling temperature
    prompt_ids, prompt_mask, completion_ids, completion_mask, _ = fixed_tensors()
    with torch.no_grad():
        logp, ent, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1),
            completion_ids.size(1), compute_entropy=True)
        ref_logp, ref_ent = direct_logp_entropy(trainer.model, 1.0)
    m = completion_mask.bool()
    assert torch.allclose(logp[m], ref_logp[m], atol=1e-5) and torch.allclose(ent[m], ref_ent[m], atol=1e-5)


def test_initial_entropy_is_saved_and_restored_on_resume(tiny_model_path, tmp_path):
    from datasets import Dataset

    data = Dataset.from_dict({"prompt": [f"What is {i} + {i + 1}?" for i in range(8)]})
    common = dict(TRAINING, output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=1,
                  num_generations=4, max_completion_length=6, logging_steps=1, save_strategy="steps", save_steps=1,
                  entropy_rule="initial", entropy_threshold=0.6931)
    first = TRLGTPOTrainer(model=tiny_model_path, reward_funcs=fixed_len_reward, args=TRLGTPOConfig(max_steps=1, **common),
                           train_dataset=data)
    first.train()
    h_ini = first.gtpo_initial_entropy
    assert h_ini is not None and h_ini > 0.6931  # random model: the paper's rule switches the filter off
    assert json.load(open(tmp_path / "checkpoint-1" / "gtpo_state.json")) == {"initial_entropy": h_ini}
    assert first.state.log_history[0]["gtpo/initial_entropy"] == pytest.approx(h_ini)
    assert first.state.log_history[0]["gtpo/filtered_frac"] == 0.0
    again = TRLGTPOTrainer(model=tiny_model_path, reward_funcs=fixed_len_reward,
                           args=TRLGTPOConfig(max_steps=2, **common), train_dataset=data)
    again._measure_initial_entropy = lambda *a, **k: pytest.fail("<H>_ini measured again after resume")
    again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert again.gtpo_initial_entropy == h_ini


def fixed_len_reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


# ------------------------------------------------------------------ (c) two processes = one process
def launch(num_processes, model_dir, out):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "MASTER_PORT": str(free_port())}
    if num_processes == 1:
        cmd = [sys.executable, SCRIPT, model_dir, out]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
               str(num_processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", env["MASTER_PORT"], SCRIPT, model_dir, out]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.load(open(os.path.join(out, "result.json")))


@pytest.mark.slow
@pytest.mark.launch
def test_two_processes_with_groups_spanning_them_match_one_process(tiny_model_path, tmp_path):
    one = launch(1, tiny_model_path, str(tmp_path / "one"))
    two = launch(2, tiny_model_path, str(tmp_path / "two"))
    assert one["world"] == 1 and two["world"] == 2
    assert two["rows_per_process"] % G != 0  # each group is split over the two processes
    for name in ("step1_loss", "conflict_frac"):
        assert two[name] == pytest.approx(one[name], abs=1e-5), name
    assert two["conflict_frac"] > 0
    w1 = torch.load(os.path.join(tmp_path, "one", "weights.pt"))
    w2 = torch.load(os.path.join(tmp_path, "two", "weights.pt"))
    init = torch.load(os.path.join(tmp_path, "one", "initial.pt"))
    assert any(not torch.equal(init[n], w1[n]) for n in w1)
    for name in w1:
        assert torch.allclose(w1[name], w2[name], atol=1e-5), name


# ------------------------------------------------------------------------------------ (e) the CLI
def test_cli_engine_trl_end_to_end(tiny_model_path, tmp_path, capsys):
    import yaml

    from gtpo.app import split_spec
    from gtpo.cli import main

    data = tmp_path / "train.jsonl"
    with open(data, "w") as fh:
        for a, b in [(1, 2), (3, 4), (5, 1), (2, 2)]:
            fh.write(json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n")
    out_dir = tmp_path / "out"
    spec = {
        "model": tiny_model_path, "dataset": {"name": str(data), "template": "plain"},
        "reward_funcs": ["last_number_correctness", "format_soft"], "output_dir": str(out_dir),
        "group_size": 4, "prompts_per_step": 2, "micro_batch_size": 4, "max_steps": 2, "max_completion_length": 6,
        "save_steps": 1, "disable_tqdm": True, "entropy_rule": "initial", "entropy_threshold": 0.6931,
        "peft": {"r": 4}, "learning_rate": 1e-3,
    }
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(spec))
    # use_vllm is a field of both engines: gtpo's own trainer takes it; engine trl hands it (and the vLLM fields
    # TRL shares) to TRL, while TRL's other options belong to engine trl only
    run, config = split_spec({**spec, "use_vllm": True}, source="run.yaml")
    assert config.use_vllm and run.trl == {}
    run, config = split_spec({**spec, "engine": "trl", "use_vllm": True, "vllm_importance_sampling_mode": "token_mask"},
                             source="run.yaml")
    assert run.trl == {"use_vllm": True, "vllm_importance_sampling_mode": "token_mask"} and not config.use_vllm
    with pytest.raises(ConfigError, match=r"run.yaml: sync_ref_model is not taken by gtpo's trainer: train this file "
                                          r"with `engine: trl`"):
        split_spec({**spec, "sync_ref_model": True}, source="run.yaml")
    # TRL's batch fields mean a batch on gtpo's trainer too (tests/test_trl_yaml.py), but not next to gtpo's own
    with pytest.raises(ConfigError, match=r"set either TRL's batch \(per_device_train_batch_size\) or gtpo's"):
        split_spec({**spec, "per_device_train_batch_size": 2}, source="run.yaml")
    with pytest.raises(ConfigError, match="unknown config field 'per_device_train_batch_sise'"):
        split_spec({**spec, "engine": "trl", "per_device_train_batch_sise": 2}, source="run.yaml")
    with pytest.raises(ConfigError, match="num_generations=4 is TRL's name of group_size, which is 4|set one of"):
        split_spec({**spec, "engine": "trl", "num_generations": 5}, source="run.yaml")  # both names, two values
    with pytest.raises(ConfigError, match="engine must be one of"):
        split_spec({**spec, "engine": "verl"}, source="run.yaml")
    run, config = split_spec({**spec, "engine": "trl", "use_vllm": False, "ddp_find_unused_parameters": False,
                              "push_to_hub": False}, source="run.yaml")
    assert run.trl == {"use_vllm": False, "ddp_find_unused_parameters": False}
    assert config.push_to_hub is False  # a GTPOConfig field of TRL's meaning, passed on by from_gtpo_config

    assert main(["train", str(cfg), "--per_device_train_batch_size", "2"]) == 2
    assert "set `engine: trl`" in capsys.readouterr().err

    assert main(["train", str(cfg), "--engine", "trl", "--seed", "1", "--logging_steps", "1"]) == 0
    assert os.path.isfile(out_dir / "adapter_model.safetensors")
    assert os.path.isfile(out_dir / "checkpoint-2" / "gtpo_state.json")
    lines = [json.loads(line) for line in open(out_dir / "metrics.jsonl")]
    steps = [line for line in lines if "reward" in line]
    assert [line["step"] for line in steps] == [1, 2]
    assert steps[0]["gtpo/initial_entropy"] > 0.6931 and steps[0]["gtpo/filtered_frac"] == 0.0
    assert "entropy" in steps[0] and "gtpo/conflict_frac" in steps[0]
    run_config = json.loads((out_dir / "run_config.json").read_text())
    assert run_config["engine"] == "trl" and run_config["entropy_rule"] == "initial"
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["engine"] == "trl" and summary["steps"] == 2
    assert os.path.isfile(out_dir / "report" / "report.md")
