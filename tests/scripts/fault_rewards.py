"""Reward functions for the fault-tolerance tests, loaded by the CLI as ``fault_rewards.py:<name>``."""


def digit_reward(completions, **kwargs):
    """Share of digit characters in each completion: dense, so every step of a tiny model moves."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
