"""Datasets as TRL users name them (issue 30, item 2): a hub dataset id (read offline from the datasets cache an
online load leaves), a local ``datasets`` directory (save_to_disk, or parquet files laid out as on the hub), the
``solution`` column of TRL's datasets; and an empty file's message."""

import glob
import os
import shutil

import datasets
import pytest

from gtpo.data import load_task

TRL_ROWS = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "solution": f"$\\boxed{{{2 * i}}}$"}
            for i in range(6)]


def test_solution_column_gives_the_answer_and_stays(tmp_path):
    path = tmp_path / "trl.parquet"
    datasets.Dataset.from_list(TRL_ROWS).to_parquet(str(path))
    ds = load_task(str(path))
    assert ds.column_names[:3] == ["prompt", "question", "answer"] and "solution" in ds.column_names
    assert ds[3]["answer"] == "6" and ds[3]["solution"] == "$\\boxed{6}$"  # the last \boxed{} of the solution
    assert ds[3]["prompt"] == TRL_ROWS[3]["prompt"] and ds[3]["question"] == "What is 3 + 3?"


def test_a_column_mapped_to_answer_is_kept_under_its_own_name_too(tmp_path):
    path = tmp_path / "qs.jsonl"
    datasets.Dataset.from_list([{"question": "1 + 1?", "solution": "2"}]).to_json(str(path))
    (row,) = load_task(str(path), columns={"answer": "solution"})
    assert row["answer"] == "2" and row["solution"] == "2"


def test_saved_dataset_directories(tmp_path):
    both = datasets.DatasetDict({"train": datasets.Dataset.from_list(TRL_ROWS[:4]),
                                 "test": datasets.Dataset.from_list(TRL_ROWS[4:])})
    both.save_to_disk(str(tmp_path / "dict"))
    assert [r["answer"] for r in load_task(str(tmp_path / "dict"))] == ["0", "2", "4", "6"]
    assert [r["answer"] for r in load_task(str(tmp_path / "dict"), split="test")] == ["8", "10"]
    with pytest.raises(ValueError, match=r"split: .*dict has splits \['test', 'train'\], got 'validation'"):
        load_task(str(tmp_path / "dict"), split="validation")
    datasets.Dataset.from_list(TRL_ROWS).save_to_disk(str(tmp_path / "one"))
    assert len(load_task(str(tmp_path / "one"), split="test", size=3)) == 3  # one dataset: the data whatever split


def test_hub_layout_directory_of_parquet_files(tmp_path):
    repo = tmp_path / "tiny-math"
    (repo / "data").mkdir(parents=True)
    datasets.Dataset.from_list(TRL_ROWS[:4]).to_parquet(str(repo / "data" / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(TRL_ROWS[4:]).to_parquet(str(repo / "data" / "test-00000-of-00001.parquet"))
    train, test = load_task(str(repo)), load_task(str(repo), split="test")
    assert len(train) == 4 and [r["answer"] for r in test] == ["8", "10"]
    assert train[0]["task"] == "tiny-math"


def _cache_hub_dataset(cache, hub_id, splits):
    """Write the datasets cache that an online ``datasets.load_dataset(hub_id)`` of parquet files leaves, so that
    the offline load of ``hub_id`` reads it (the same call, the same cache layout)."""
    files = {}
    for split, rows in splits.items():
        files[split] = str(cache / f"src-{split}.parquet")
        datasets.Dataset.from_list(rows).to_parquet(files[split])
    datasets.load_dataset("parquet", data_files=files, cache_dir=str(cache / "build"))
    (built,) = glob.glob(str(cache / "build" / "parquet" / "*" / "0.0.0" / "*" / "dataset_info.json"))
    namespace, name = hub_id.split("/")
    target = cache / f"{namespace}___{name}" / "default" / "0.0.0" / ("0" * 40)
    shutil.copytree(os.path.dirname(built), target)
    for arrow in target.glob("parquet-*.arrow"):
        arrow.rename(target / arrow.name.replace("parquet-", f"{name}-", 1))


def test_hub_dataset_id_offline_from_the_cache(tmp_path, monkeypatch):
    _cache_hub_dataset(tmp_path / "cache", "someorg/tiny-math", {"train": TRL_ROWS[:4], "test": TRL_ROWS[4:]})
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    assert [r["answer"] for r in load_task("someorg/tiny-math", split="test")] == ["8", "10"]
    assert len(load_task("someorg/tiny-math")) == 4


def test_hub_dataset_id_not_cached_offline_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty-cache")
    with pytest.raises(ValueError, match=r"could not load dataset 'someorg/absent' \(config None, split 'train'\) from "
                                         r"the Hugging Face hub: .* Offline \(HF_DATASETS_OFFLINE=1\) only datasets "
                                         r"already in the cache load: .*save_to_disk\(DIR\)\) and give DIR"):
        load_task("someorg/absent")


def test_empty_file_says_it_is_empty(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"empty.jsonl: the file is empty \(no rows\)$"):
        load_task(str(tmp_path / "empty.jsonl"))


def test_loading_draws_no_progress_bars_and_restores_the_setting(tmp_path, capfd):
    from datasets.utils import logging as ds_logging

    path = tmp_path / "rows.jsonl"
    datasets.Dataset.from_list([{"question": "1 + 1?", "answer": "2"}]).to_json(str(path))
    capfd.readouterr()
    assert ds_logging.is_progress_bar_enabled()
    load_task(str(path))
    assert "Generating" not in capfd.readouterr().err  # datasets' "Generating train split" bar
    assert ds_logging.is_progress_bar_enabled()
