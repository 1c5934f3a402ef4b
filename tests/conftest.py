"""Shared fixtures: tiny offline models (built once per test session) and offline settings."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

#: The test files that take the longest, longest first (their tests' summed time in scripts/test.sh's two-worker phase,
#: measured 2026-12-05: test_readme_bench ~400 s, test_launch ~230 s, ... test_save_strategy ~30 s). They are
#: collected first, so that the two pytest-xdist workers (``--dist loadfile --no-loadscope-reorder``) start them
#: first and the phase does not end on one long file while the other worker idles (measured before: the last ~100 s).
#: Only the order of files changes; a file's tests keep theirs. A stale list costs time, never a result.
LONGEST_FIRST = (
    "tests/test_readme_bench.py", "tests/test_launch.py", "tests/test_nodes.py", "tests/test_decode_compile.py",
    "tests/test_trl_yaml_journeys.py", "tests/test_trl_switches.py", "tests/test_trl_schedule_options.py",
    "tests/test_dtype_device.py", "tests/test_faults.py", "tests/test_journeys.py", "tests/test_tools.py",
    "tests/test_trl_yaml.py", "experiments/test_protocol.py", "tests/test_ddp_eval.py", "tests/test_trl_engine.py",
    "tests/test_models_cache.py", "tests/test_trackers.py", "tests/test_ddp.py", "tests/test_save_strategy.py",
    "tests/test_launch_options.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: files stay contiguous


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
