"""configs/verl's data and reward: verl loads the reward by its pkg:// path; the parquet rows are verl's RL format."""

import json

import pytest

pytest.importorskip("verl")

from verl.utils.import_utils import load_extern_object  # noqa: E402

from gtpo.rewards import paper_score  # noqa: E402


def test_verl_loads_the_paper_reward_by_the_configs_path():
    fn = load_extern_object(module_path="pkg://gtpo.integrations.verl_recipe", object_name="compute_score")
    good = "<reasoning>\n2 + 2 = 4\n</reasoning>\n<answer>\n4\n</answer>"
    assert fn("gtpo/paper", good, "4") == paper_score(good, "4")
    assert fn("gtpo/paper", "no tags at all", "4") == paper_score("no tags at all", "4")


def test_parquet_rows_are_verls_rl_format(tmp_path):
    import datasets

    from gtpo.integrations.verl_recipe import write_parquet

    src = tmp_path / "gsm.jsonl"
    src.write_text("\n".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"})
                             for i in range(3)) + "\n")
    files = write_parquet(str(tmp_path / "out"), path=str(src), splits=("train",))
    rows = datasets.Dataset.from_parquet(files["train"]).to_list()
    assert len(rows) == 3 and rows[0]["data_source"] == "gtpo/paper"
    assert rows[2]["reward_model"] == {"style": "rule", "ground_truth": "4"}
    assert rows[0]["prompt"][0]["role"] == "system" and rows[0]["prompt"][-1]["content"].endswith("What is 0 + 0?")
