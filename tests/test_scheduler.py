"""The learning-rate schedule's warm-up: ``warmup_steps`` (TRL's meaning: a count of steps, or a fraction in (0, 1)
of them; overriding ``warmup_ratio`` when > 0) on gtpo's trainer and on TRL's engine."""

from __future__ import annotations

import pytest
import torch

from gtpo import GTPOConfig
from gtpo.errors import ConfigValueError
from gtpo.run.build import build_scheduler


def learning_rates(config: GTPOConfig) -> list[float]:
    """The learning rate of each of ``max_steps`` steps of gtpo's schedule, at a peak of 1.0."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.learning_rate)
    scheduler = build_scheduler(optimizer, config)
    rates = []
    for _ in range(config.max_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_warmup_steps_on_gtpo_trainer():
    config = GTPOConfig(learning_rate=1.0, max_steps=10, lr_scheduler_type="linear", warmup_steps=4)
    # linear from 0 to the peak over 4 steps, then linear decay to 0 at step 10
    assert learning_rates(config) == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6],
                                                   abs=1e-12)
    assert config.num_warmup_steps() == 4
    assert config.replace(warmup_ratio=0.5).num_warmup_steps() == 4  # warmup_steps > 0 overrides the ratio
    assert config.replace(warmup_steps=0.25).num_warmup_steps() == 3  # a fraction of max_steps, rounded up
    assert config.replace(warmup_steps=0, warmup_ratio=0.5).num_warmup_steps() == 5  # 0: the ratio decides
    assert GTPOConfig(max_steps=10).num_warmup_steps() == 0
    with pytest.raises(ConfigValueError, match="warmup_steps") as err:
        GTPOConfig(warmup_steps=-1)
    assert err.value.field == "warmup_steps"


def test_warmup_steps_on_trl_engine():
    """TRL counts optimizer steps (num_iterations per gtpo step): its schedule warms up over the same rollouts."""
    pytest.importorskip("trl")
    from gtpo.integrations.trl import TRLGTPOConfig

    for warmup, expected in ((3, 6), (0.25, 5)):  # 3 steps of 2 updates; ceil(0.25 * 10 * 2)
        config = GTPOConfig(max_steps=10, num_iterations=2, warmup_steps=warmup, warmup_ratio=0.5)
        args = TRLGTPOConfig.from_gtpo_config(config, use_cpu=True)
        assert args.max_steps == 20 and args.warmup_steps == expected
        assert args.get_warmup_steps(args.max_steps) == expected  # what TRL's Trainer builds its schedule with
