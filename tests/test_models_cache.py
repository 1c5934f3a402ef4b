"""A GGUF is converted once into a plain model directory in gtpo's cache (``gtpo.run.models.converted_gguf``), and
later loads read that directory: the same weights, config and tokenizer as loading the GGUF itself, no
half-written directory after a failed conversion, and the GGUF loaded as it is where the cache is not writable."""

from __future__ import annotations

import json
import os

import pytest
import torch

from gtpo.run import models


@pytest.fixture
def fake_gguf(tmp_path, tiny_model_path, monkeypatch):
    """A file named ``tiny.gguf`` whose "GGUF load" (transformers' ``from_pretrained(..., gguf_file=...)``) returns
    the tiny Llama and its tokenizer, counting the loads; gtpo's cache in ``tmp_path/cache``."""
    import transformers

    path = tmp_path / "gguf" / "tiny.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF")
    monkeypatch.setenv("GTPO_CACHE", str(tmp_path / "cache"))
    loads = {"model": 0, "tokenizer": 0}
    real_model, real_tok = transformers.AutoModelForCausalLM.from_pretrained, transformers.AutoTokenizer.from_pretrained

    def model_load(source, *args, gguf_file=None, **kwargs):
        if gguf_file is None:
            return real_model(source, *args, **kwargs)
        assert (source, gguf_file) == (str(path.parent), "tiny.gguf")
        loads["model"] += 1
        model = real_model(tiny_model_path, *args, **kwargs)
        model.config.quantization_config = {"quant_method": "gguf"}  # as transformers marks a dequantized GGUF
        return model

    def tok_load(source, *args, gguf_file=None, **kwargs):
        if gguf_file is None:
            return real_tok(source, *args, **kwargs)
        loads["tokenizer"] += 1
        return real_tok(tiny_model_path, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_load)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tok_load)
    return path, loads


def test_a_gguf_is_converted_once_and_then_loaded_from_the_cache(fake_gguf, tiny_model_path):
    path, loads = fake_gguf
    first = models.load_model(str(path), dtype="bfloat16")
    tok = models.load_tokenizer(str(path))
    again = models.load_model(str(path), dtype="bfloat16")
    assert loads == {"model": 1, "tokenizer": 1}  # one conversion; every load after it reads the directory
    reference = models.load_model(tiny_model_path, dtype="bfloat16")
    for a, b, r in zip(first.state_dict().values(), again.state_dict().values(), reference.state_dict().values()):
        assert a.dtype == torch.bfloat16 and torch.equal(a, r) and torch.equal(b, r)
    assert getattr(first.config, "quantization_config", None) is None  # saves as a plain float model
    assert tok("a b c").input_ids == models.load_tokenizer(tiny_model_path)("a b c").input_ids
    cache = os.path.join(os.environ["GTPO_CACHE"], "gguf")
    (converted,) = os.listdir(cache)
    source = json.load(open(os.path.join(cache, converted, "gguf_source.json")))
    assert source["gguf"] == os.path.realpath(path) and source["size"] == 4


def test_a_changed_gguf_is_converted_again(fake_gguf):
    path, loads = fake_gguf
    models.load_tokenizer(str(path))
    path.write_bytes(b"GGUF, another version")
    models.load_tokenizer(str(path))
    assert loads == {"model": 2, "tokenizer": 2}
    (kept,) = os.listdir(os.path.join(os.environ["GTPO_CACHE"], "gguf"))  # the first file's conversion is dropped
    source = json.load(open(os.path.join(os.environ["GTPO_CACHE"], "gguf", kept, "gguf_source.json")))
    assert source["size"] == len(b"GGUF, another version")


def test_a_failed_conversion_leaves_nothing_behind(fake_gguf, monkeypatch):
    import transformers

    path, _ = fake_gguf

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "save_pretrained", disk_full)
    with pytest.raises(OSError, match="No space left"):
        models.load_model(str(path))
    assert os.listdir(os.path.join(os.environ["GTPO_CACHE"], "gguf")) == []  # no model, no temporary directory


def test_a_conversion_finished_by_another_process_first_is_used(fake_gguf, monkeypatch):
    """Two ranks converting at once: the second rename finds the first's complete directory and keeps it."""
    path, loads = fake_gguf
    real_replace = os.replace
    dest = {}

    def other_process_wins(src, dst):
        real_replace(src, dst)  # the other process's complete copy lands first...
        dest["path"] = dst
        raise OSError(39, "Directory not empty")  # ...and this one's rename then fails

    monkeypatch.setattr(os, "replace", other_process_wins)
    assert models.converted_gguf(str(path.parent), path.name) == dest["path"]
    assert sorted(os.listdir(os.path.dirname(dest["path"]))) == [os.path.basename(dest["path"])]


def test_an_unwritable_cache_loads_the_gguf_as_it_is(fake_gguf, tmp_path, monkeypatch):
    path, loads = fake_gguf
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("GTPO_CACHE", str(blocker))
    model = models.load_model(str(path))
    models.load_model(str(path))
    assert loads["model"] == 2 and getattr(model.config, "quantization_config", None) is None


@pytest.mark.smollm
def test_the_converted_smollm2_is_the_gguf_transformers_loads():
    """The real GGUF: the converted directory (the cache every SmolLM2 run uses) holds the weights, config and
    tokenizer transformers gives for the GGUF itself, in bfloat16 as in float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        directory, file = models.smollm2_path()
    except ValueError as err:
        pytest.skip(str(err))
    converted = models.converted_gguf(directory, file)
    direct = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.bfloat16)
    cached = models.load_model(models.SMOLLM2, dtype="bfloat16")
    assert cached.config._name_or_path == converted
    a, b = direct.state_dict(), cached.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    skip = {"_name_or_path", "quantization_config", "architectures", "dtype"}
    assert {k: v for k, v in direct.config.to_dict().items() if k not in skip} == \
        {k: v for k, v in cached.config.to_dict().items() if k not in skip}
    assert direct.generation_config.to_dict() == cached.generation_config.to_dict()
    t1, t2 = AutoTokenizer.from_pretrained(directory, gguf_file=file), models.load_tokenizer(models.SMOLLM2)
    assert t1.get_vocab() == t2.get_vocab() and t1.chat_template == t2.chat_template
    assert t1.all_special_ids == t2.all_special_ids and (t1.eos_token, t1.pad_token) == (t2.eos_token, t2.pad_token)
    text = "<|im_start|>user\nÜnïcödé 数学 🙂  12345.6789\t+ 2x^2<|im_end|>\n"
    assert t1(text).input_ids == t2(text).input_ids
    chat = [{"role": "user", "content": "What is 3 + 4?"}]
    assert t1.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        t2.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
