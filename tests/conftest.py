"""Shared fixtures: tiny offline models (built once per test session) and offline settings."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A ~100k-parameter random Llama with a BPE tokenizer (eos == pad), on disk."""
    from gtpo.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama", seed=0)


@pytest.fixture(scope="session")
def tiny_qwen_path(tmp_path_factory):
    """A tiny random Qwen2 with a separate pad token."""
    from gtpo.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen"), arch="qwen2", eos_equals_pad=False, seed=1)
