"""Tiny, offline causal language models for tests, benchmarks and examples.

Nothing can be downloaded from a model hub on the machines this project is built on, so tests
build their models here: a byte-level BPE tokenizer trained in milliseconds on a small synthetic
corpus (digits, arithmetic, the paper's ``<reasoning>``/``<answer>`` tags, a ChatML chat
template) and a randomly initialised Llama or Qwen2 model of a few hundred thousand parameters.
Both are written with ``save_pretrained`` so they load through the same
``AutoModelForCausalLM.from_pretrained(path)`` code path as a hub model.
"""

from __future__ import annotations

import os
import random

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = (
    "the a of to and in is what how many sum difference answer question reasoning think step by "
    "first then so total left right plus minus equals number result final compute add subtract "
    "respond following format apples books cats dogs has have gives takes more less each"
).split()


def _corpus(n_lines: int = 3000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        op = rng.choice(["+", "-"])
        res = a + b if op == "+" else a - b
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 8)))
        lines.append(f"What is {a} {op} {b}? {words}")
        lines.append(f"<reasoning>\n{a} {op} {b} = {res}\n</reasoning>\n<answer>\n{res}\n</answer>")
    return lines


def build_tiny_tokenizer(*, vocab_size: int = 512, eos_equals_pad: bool = True, seed: int = 0):
    """Train a byte-level BPE tokenizer on a synthetic corpus and wrap it for transformers.

    Args:
        vocab_size: target vocabulary size (the 256 byte symbols and the special tokens included).
        eos_equals_pad: when True the pad token is the EOS token ``<|im_end|>`` (as in SmolLM2 and
            Qwen base models) so code paths that must not confuse padding with EOS are exercised;
            when False a separate ``<|pad|>`` token exists.
        seed: seed of the synthetic corpus.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with a ChatML chat template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + ([] if eos_equals_pad else ["<|pad|>"])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed=seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        unk_token=None,
        pad_token="<|im_end|>" if eos_equals_pad else "<|pad|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(
    path: str | os.PathLike,
    *,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    vocab_size: int = 512,
    eos_equals_pad: bool = True,
    tie_word_embeddings: bool = True,
    seed: int = 0,
) -> str:
    """Write a tiny random causal LM and its tokenizer to ``path`` and return the path.

    Args:
        path: directory to write (created if missing).
        arch: ``"llama"`` (as SmolLM2 / Llama-3.1) or ``"qwen2"`` (as Qwen2.5).
        hidden_size, num_layers, num_heads, intermediate_size: model size; the defaults give about
            100k parameters, a training step of a few milliseconds on CPU.
        vocab_size: tokenizer vocabulary size (the model's embedding matches it).
        eos_equals_pad: see :func:`build_tiny_tokenizer`.
        tie_word_embeddings: tie the LM head to the input embedding (as SmolLM2).
        seed: seed of the weights and of the tokenizer corpus.

    Returns:
        ``str(path)``, loadable with ``AutoModelForCausalLM.from_pretrained`` and
        ``AutoTokenizer.from_pretrained``.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    path = str(path)
    os.makedirs(path, exist_ok=True)
    tokenizer = build_tiny_tokenizer(vocab_size=vocab_size, eos_equals_pad=eos_equals_pad, seed=seed)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=1024,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    if arch == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    elif arch == "qwen2":
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    else:
        raise ValueError(f"arch must be 'llama' or 'qwen2', got {arch!r}")
    torch.manual_seed(seed)
    model = cls(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
