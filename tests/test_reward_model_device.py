"""Where a sequence-classification reward model scores (issue 42, defect 2): on the run's device (the policy's
accelerator device, as TRL prepares reward models with its accelerator), with the host rollout's texts sent to it,
never moved to the host because rollouts live there. No GPU here: the meta device stands in for ``cuda:0`` (a
device other than the rollout's host tensors, holding no values), and a real CPU run checks that the scores are the
classifier's logits, unchanged. Fixtures: tests/test_scoring.py's tiny reward model."""

from types import SimpleNamespace

import pytest
import torch

import gtpo.trainer
from gtpo import GTPOTrainer
from gtpo.rewards.scoring import RewardScorer, SequenceClassificationReward
from gtpo.sampling.rollout import Rollout
from test_scoring import ROWS, build_reward_model, config, logit_by_hand

PROMPTS = ["What is 2 + 2?", "What is 10 + 7?"]
TEXTS = [" 4", " the answer is 17 so 17"]


@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory):
    return build_reward_model(tmp_path_factory.mktemp("rm") / "tiny-rm")


def host_rollout(texts):
    """A rollout as gtpo's samplers return it: host (CPU) tensors; ``(N, 2)`` prompt and completion ids."""
    n = len(texts)
    ones = torch.ones(n, 2, dtype=torch.long)
    return Rollout(ones, ones, ones, ones, torch.zeros(n, dtype=torch.bool), list(texts))


def model_device(reward):
    return next(reward.model.parameters()).device


def record_devices(reward):
    """Record the device of each input the model's forward receives and give back host logits ``(N, 1)`` of 1.0:
    meta tensors hold no values, so a meta model cannot run its forward (Llama's reads a value) nor give scores."""
    seen = []

    def forward(**kwargs):
        seen.extend(v.device for v in kwargs.values() if isinstance(v, torch.Tensor))
        return SimpleNamespace(logits=torch.ones(kwargs["input_ids"].shape[0], 1))

    reward.model.forward = forward
    return seen


def test_scorer_places_the_reward_model_on_the_run_device(reward_model_path):
    reward = SequenceClassificationReward.from_pretrained(reward_model_path)
    RewardScorer([reward], device=torch.device("meta"))  # "meta" standing in for the run's cuda:0
    assert model_device(reward) == torch.device("meta")


def test_a_host_rollout_does_not_pull_the_reward_model_to_the_host(reward_model_path):
    reward = SequenceClassificationReward.from_pretrained(reward_model_path)
    reward.place(torch.device("meta"))  # the run's device
    seen = record_devices(reward)
    scorer = RewardScorer([reward])
    rewards, per_func = scorer(host_rollout(TEXTS), PROMPTS, {}, rows=[0, 1], group_size=1, step=0)
    assert model_device(reward) == torch.device("meta")  # the model stays where the run put it
    assert seen and all(d == torch.device("meta") for d in seen)  # the host inputs were sent to it
    assert rewards.device == torch.device("cpu") and rewards.tolist() == [1.0, 1.0]  # scores back on the host


def test_scores_on_the_cpu_are_the_classifier_logits(reward_model_path):
    reward = SequenceClassificationReward.from_pretrained(reward_model_path)
    scorer = RewardScorer([reward], [2.0], device=torch.device("cpu"))
    rewards, per_func = scorer(host_rollout(TEXTS), PROMPTS, {}, rows=[0, 1], group_size=1, step=0)
    want = [logit_by_hand(reward_model_path, p + c) for p, c in zip(PROMPTS, TEXTS)]
    assert per_func[:, 0].tolist() == pytest.approx(want, abs=1e-5)
    assert rewards.tolist() == pytest.approx([2 * w for w in want], abs=1e-5)


def test_the_trainer_gives_the_scorer_its_accelerator_device(tiny_model_path, reward_model_path, tmp_path,
                                                              monkeypatch):
    got = {}

    class Recording(RewardScorer):
        def __init__(self, *args, **kwargs):
            got["device"] = kwargs.get("device")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gtpo.trainer, "RewardScorer", Recording)
    trainer = GTPOTrainer(tiny_model_path, [reward_model_path], ROWS, args=config(tmp_path, max_steps=1))
    assert got["device"] == trainer.accelerator.device
    assert model_device(trainer.scorer.funcs[0]) == trainer.accelerator.device
