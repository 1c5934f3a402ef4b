"""Rollouts: G sampled completions per prompt, the prompts' encoding, and the order prompts are drawn in.

Rows are prompt-major: completion ``s`` of prompt ``p`` is row ``p * num_samples + s``, the layout
every maths function of the package expects (``rewards (N,)`` with ``N = P * G``).
:func:`generate` samples with gtpo's decoding loop (:mod:`gtpo.sampling.decode`) or transformers
``generate``, each distinct prompt prefilled once (:mod:`gtpo.sampling.shared_prefix`);
:class:`PromptSampler` is the seeded, resumable data order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch

from .decode import decode, decode_compile_options, decode_loop_config, prefill, prefill_shared
from .lora_merge import merged_lora_layers
from .padding import completion_mask_from_ids, left_pad
from .shared_prefix import cache_kwarg

__all__ = ["PromptSampler", "Rollout", "SamplingParams", "encode_dataset_prompts", "encode_prompts", "eos_token_ids",
           "generate", "prompt_text"]

logger = logging.getLogger("gtpo")


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled: built once (:meth:`for_rollout`, :meth:`for_evaluation`) and passed to every
    sampler as it is (gtpo's decoding loop and transformers ``generate`` in :func:`generate`, vLLM in
    :meth:`gtpo.sampling.vllm_engine.VLLMEngine.generate`, the in-training evaluation).

    Attributes:
        max_new_tokens: T, the most tokens a completion gets.
        temperature: divides the logits; ``<= 0`` decodes greedily.
        top_p: nucleus sampling probability (1.0: off).
        top_k: sample from the k most likely tokens (0: off).
        repetition_penalty: 1.0: none (other values sample with transformers ``generate``).
        do_sample: False decodes greedily whatever the temperature.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    do_sample: bool = True

    @property
    def greedy(self) -> bool:
        """Whether every sampler decodes greedily (``do_sample`` False or ``temperature <= 0``)."""
        return not self.do_sample or self.temperature <= 0

    @classmethod
    def for_rollout(cls, config) -> "SamplingParams":
        """The rollouts' sampling of ``config`` (a :class:`gtpo.GTPOConfig`): ``max_completion_length``,
        ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``."""
        return cls(max_new_tokens=config.max_completion_length, temperature=config.temperature, top_p=config.top_p,
                   top_k=config.top_k, repetition_penalty=config.repetition_penalty)

    @classmethod
    def for_evaluation(cls, config) -> "SamplingParams":
        """The in-training evaluation's sampling of ``config``: ``eval_max_new_tokens`` (None:
        ``max_completion_length``) at ``eval_temperature`` (0: greedy), no top-p / top-k truncation."""
        return cls(max_new_tokens=config.resolved_eval_max_new_tokens, temperature=config.eval_temperature)

    @classmethod
    def given(cls, sampling: "SamplingParams | None", settings: dict, where: str) -> "SamplingParams":
        """``sampling``, or the one the keyword ``settings`` of a sampler's call describe (``max_new_tokens=...,
        temperature=...``: its fields, the others at their defaults); both at once, or a keyword that is no field,
        is a TypeError naming ``where`` (the function called)."""
        if sampling is not None and settings:
            raise TypeError(f"{where}: pass sampling=SamplingParams(...) or its fields as keywords "
                            f"({', '.join(sorted(settings))}), not both")
        if sampling is not None:
            return sampling
        unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"{where}() got unexpected keyword arguments {unknown} (SamplingParams fields: "
                            f"{[f.name for f in dataclasses.fields(cls)]})")
        return cls(**settings)


@dataclass
class Rollout:
    """A batch of sampled completions.

    Attributes:
        prompt_ids: ``(N, S)`` prompt tokens, left-padded.
        prompt_mask: ``(N, S)`` 1 on prompt tokens, 0 on left padding.
        completion_ids: ``(N, T)`` generated tokens, right-padded with the pad id.
        completion_mask: ``(N, T)`` 1 on generated tokens through the first EOS (included).
        truncated: ``(N,)`` bool, True where no EOS was produced within ``max_new_tokens``.
        texts: ``N`` decoded completions (special tokens skipped).
        sampling_logp: ``(N, T)`` float32 log-probs the sampler gave its sampled tokens (vLLM:
            :mod:`gtpo.sampling.vllm_engine`), 0 outside ``completion_mask``; None when the sampler gives none
            (gtpo's decoding loop and transformers ``generate``, whose log-probs are the policy's own).
        agent: a multi-turn rollout's :class:`gtpo.sampling.tools.AgentTrace` (``tool_mask (N, T)``, the
            conversations, the tool-call counts; :func:`gtpo.sampling.tools.tool_rollout`); None for single-turn
            completions. With it, ``completion_mask`` covers the tool tokens too (through the completion's last token)
            and ``tool_mask`` takes them out of the loss.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    truncated: torch.Tensor
    texts: list[str]
    sampling_logp: torch.Tensor | None = None
    agent: Any = None  # gtpo.sampling.tools.AgentTrace (not imported: tools imports this module)

    @property
    def lengths(self) -> torch.Tensor:
        """``(N,)`` number of masked completion tokens."""
        return self.completion_mask.sum(dim=1)

    def pin_memory(self) -> "Rollout":
        """The same rollout with its tensors in pinned (page-locked) host memory, so that the update's
        per-micro-batch copies to the GPU are direct DMA transfers (``non_blocking`` can overlap them);
        itself where no CUDA device exists."""
        if not torch.cuda.is_available():
            return self
        pin = (lambda t: None if t is None else t.pin_memory())
        return dataclasses.replace(self, prompt_ids=pin(self.prompt_ids), prompt_mask=pin(self.prompt_mask),
                                   completion_ids=pin(self.completion_ids),
                                   completion_mask=pin(self.completion_mask), truncated=pin(self.truncated),
                                   sampling_logp=pin(self.sampling_logp))


def prompt_text(tokenizer, prompt) -> str:
    """The text fed to the model for one prompt.

    A list of chat messages (a "conversational" prompt) goes through the tokenizer's chat template
    with ``add_generation_prompt=True``; a string (a "standard" prompt) is used as it is.
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "a conversational prompt (a list of chat messages) needs a tokenizer with a chat template; "
                "this tokenizer has none. Set tokenizer.chat_template or give prompts as plain strings."
            )
        return tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    raise ValueError(
        f"a prompt must be a string or a list of {{'role', 'content'}} messages, got {type(prompt).__name__}"
    )


def encode_prompts(tokenizer, prompts: list) -> list[list[int]]:
    """Token ids of each prompt (chat template applied; no special tokens added twice)."""
    ids = []
    for prompt in prompts:
        text = prompt_text(tokenizer, prompt)
        add_special = isinstance(prompt, str)
        ids.append(tokenizer(text, add_special_tokens=add_special)["input_ids"])
    return ids


def encode_dataset_prompts(dataset, tokenizer, max_prompt_length: int, *, render=None):
    """``(dataset, prompt_ids, dropped)``: ``dataset`` (a ``datasets.Dataset`` with a ``prompt`` column)
    without the prompts longer than ``max_prompt_length`` tokens, the token ids of its prompts
    (:func:`encode_prompts`, or ``render(prompt) -> ids``: with tools, the chat template showing them), and how
    many were dropped (with a warning). Errors name the row."""
    if len(dataset) == 0:
        raise ValueError("train_dataset is empty: give at least one row with a 'prompt'")
    if "prompt" not in dataset.column_names:
        hint = " (rename the question column to 'prompt')" if "question" in dataset.column_names else ""
        raise ValueError(f"train_dataset has no 'prompt' column (columns: {dataset.column_names}){hint}")
    ids = []
    for i, prompt in enumerate(dataset["prompt"]):  # one by one, so that an error names its row
        try:
            ids.extend(encode_prompts(tokenizer, [prompt]) if render is None else [render(prompt)])
        except ValueError as err:
            raise ValueError(f"train_dataset row {i}: {err}") from err
        except Exception as err:  # e.g. a chat template that fails on malformed messages
            raise ValueError(f"train_dataset row {i}: cannot encode the prompt {prompt!r:.200}: "
                             f"{type(err).__name__}: {err}") from err
    limit = max_prompt_length
    keep = [i for i, x in enumerate(ids) if len(x) <= limit]
    if not keep:
        raise ValueError(f"every prompt of train_dataset is longer than max_prompt_length={limit} tokens (the "
                         f"shortest has {min(len(x) for x in ids)}); raise max_prompt_length")
    dropped = len(ids) - len(keep)
    if dropped:
        logger.warning("train_dataset: dropped %d of %d prompts longer than max_prompt_length=%d",
                       dropped, len(ids), limit)
        dataset = dataset.select(keep)
    return dataset, [ids[i] for i in keep], dropped


def eos_token_ids(tokenizer, model=None) -> list[int]:
    """EOS ids from the model's generation config and the tokenizer (deduplicated)."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if i is not None and i not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation config defines an EOS token")
    return ids


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list,
    *,
    sampling: SamplingParams | None = None,
    num_samples: int = 1,
    batch_size: int | None = None,
    max_prompt_length: int | None = None,
    prompt_ids: list[list[int]] | None = None,
    share_prompt_prefill: bool = True,
    decode_loop: bool = True,
    merge_lora: bool = True,
    decode_compile: bool | str = "auto",
    **settings,
) -> Rollout:
    """Sample ``num_samples`` completions for each prompt.

    Args:
        model: a causal LM (a ``PreTrainedModel`` or a peft model; not a DDP wrapper).
        tokenizer: its tokenizer (pad token set).
        prompts: ``P`` prompts, strings or chat-message lists.
        sampling: the :class:`SamplingParams` (``max_new_tokens`` T, temperature, top-p / top-k, repetition
            penalty; greedy at ``temperature <= 0`` or ``do_sample=False``).
        num_samples: G, completions per prompt.
        batch_size: completions per ``generate`` call (None: all at once).
        max_prompt_length: raise if a prompt is longer (the trainer drops such prompts beforehand).
        prompt_ids: pre-tokenised prompts (skips tokenisation).
        share_prompt_prefill: prefill each distinct prompt once and copy its key/value cache to
            its ``num_samples`` rows (see the module docstring; same distribution, less work);
            False prefills every row (plain ``generate``).
        decode_loop: sample with :func:`decode` (this module's decoding loop over the model's
            forward and key/value cache, with transformers' logits processors; finished rows leave
            the batch) where :func:`decode_loop_config` says it covers the settings; False, or
            settings it does not cover, use ``model.generate``.
        merge_lora: sample with the float32/float64 LoRA layers of a peft model replaced by plain
            linear layers holding their merged weights (:func:`gtpo.sampling.lora_merge.merged_lora_layers`:
            one matmul per layer instead of three; the model is left unchanged, one copy of the
            adapted weights is held while sampling); the same distribution up to float rounding.
        decode_compile: run :func:`decode`'s steps over a static key/value cache, compiled
            (``GTPOConfig.decode_compile``: ``"auto"``, True or False; resolved for the model's
            device by :func:`gtpo.sampling.decode.decode_compile_options`); the same tokens.
        settings: ``SamplingParams``' fields as keywords instead of ``sampling`` (``max_new_tokens=8,
            temperature=0.7``).

    Returns:
        A :class:`Rollout` with ``N = P * num_samples`` rows, prompt-major.
    """
    from transformers import GenerationConfig

    sampling = SamplingParams.given(sampling, settings, "generate")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if prompt_ids is None:
        prompt_ids = encode_prompts(tokenizer, prompts)
    if max_prompt_length is not None:
        for i, ids in enumerate(prompt_ids):
            if len(ids) > max_prompt_length:
                raise ValueError(f"prompt {i} has {len(ids)} tokens, more than max_prompt_length={max_prompt_length}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = eos_token_ids(tokenizer, model)
    greedy = sampling.greedy
    gen_config = GenerationConfig(
        max_new_tokens=sampling.max_new_tokens,
        do_sample=not greedy,
        temperature=None if greedy else sampling.temperature,
        top_p=None if greedy else sampling.top_p,
        # 0 = off, passed explicitly: left unset (None), transformers fills in its global default
        # top_k=50 and would sample from the 50 most likely tokens only
        top_k=None if greedy else int(sampling.top_k or 0),
        repetition_penalty=sampling.repetition_penalty,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        bos_token_id=getattr(tokenizer, "bos_token_id", None),
    )
    loop_config = decode_loop_config(model, gen_config) if decode_loop else None
    rows = [ids for ids in prompt_ids for _ in range(num_samples)]
    step = batch_size or len(rows)
    device = next(model.parameters()).device
    compile_options = decode_compile_options(decode_compile, device) if loop_config is not None else None
    was_training = model.training
    model.eval()
    chunks = []
    try:
        with merged_lora_layers(model) if merge_lora else contextlib.nullcontext():
            for start in range(0, len(rows), step):
                ids, mask = left_pad(rows[start:start + step], pad_id)
                comp = _sample_rows(model, ids.to(device), mask.to(device), gen_config, loop_config,
                                    share=share_prompt_prefill and num_samples > 1, eos_ids=eos_ids, pad_id=pad_id,
                                    compile_options=compile_options)
                chunks.append((ids, mask, comp.cpu().clone()))
    finally:
        model.train(was_training)
    width_s = max(c[0].shape[1] for c in chunks)
    width_t = max(max(c[2].shape[1] for c in chunks), 1)
    p_ids, p_mask, c_ids = [], [], []
    for ids, mask, comp in chunks:
        pad_s = width_s - ids.shape[1]
        p_ids.append(torch.nn.functional.pad(ids, (pad_s, 0), value=pad_id))
        p_mask.append(torch.nn.functional.pad(mask, (pad_s, 0), value=0))
        c_ids.append(torch.nn.functional.pad(comp, (0, width_t - comp.shape[1]), value=pad_id))
    completion_ids = torch.cat(c_ids)
    completion_mask, truncated = completion_mask_from_ids(completion_ids, eos_ids)
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad_id)
    texts = tokenizer.batch_decode(
        [ids[m.bool()].tolist() for ids, m in zip(completion_ids, completion_mask)], skip_special_tokens=True
    )
    rollout = Rollout(
        prompt_ids=torch.cat(p_ids),
        prompt_mask=torch.cat(p_mask),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=truncated,
        texts=texts,
    )
    return rollout.pin_memory() if device.type == "cuda" else rollout


def _sample_rows(model, ids: torch.Tensor, mask: torch.Tensor, gen_config, loop_config, *, share: bool,
                 eos_ids: list[int], pad_id: int, compile_options: dict | None = None) -> torch.Tensor:
    """``(n, T')`` completions of the left-padded prompt rows ``ids (n, S)`` / ``mask (n, S)``: the
    prompt cache prefilled once per distinct prompt (``share``) or per row, then :func:`decode` when
    ``loop_config`` is set (and the cache a plain one; its steps compiled with ``compile_options``), else
    ``model.generate``."""
    # inference mode: no autograd bookkeeping at all (measured ~5 % faster than no_grad on the tiny
    # CPU models of bench/); the caller clones the ids out as normal tensors
    with torch.inference_mode():
        cache = prefill_shared(model, ids, mask) if share else None
        if loop_config is not None and cache is None:
            cache = prefill(model, ids, mask)
        if loop_config is not None and cache is not None:
            return decode(model, ids, mask, cache, loop_config, eos_ids=eos_ids, pad_id=pad_id,
                          compile_options=compile_options)
        extra = {} if cache is None else {cache_kwarg(): cache}
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_config, **extra)
        return out[:, ids.shape[1]:]


class PromptSampler:
    """Epoch-wise seeded permutation of dataset rows; its state makes resuming exact.

    ``batch_size`` (optional) makes an epoch drop its incomplete tail, as TRL's ``RepeatSampler`` does: an epoch is
    the first ``size // batch_size * batch_size`` rows of its permutation, so a caller that takes ``batch_size`` rows
    at a time sees each row at most once per epoch and never a batch that straddles two epochs. Without it (the
    default) an epoch is every row and a batch may continue into the next epoch's permutation. The state
    (``epoch``, ``position``) is the same in both cases, so checkpoints of either kind load."""

    def __init__(self, size: int, seed: int, *, batch_size: int | None = None):
        if batch_size is not None and not 1 <= batch_size <= size:
            raise ValueError(f"PromptSampler: batch_size ({batch_size}) must be in [1, size={size}]: an epoch that "
                             "drops its incomplete tail needs at least one whole batch")
        self.size, self.seed = size, seed
        #: rows of each permutation used before the next epoch starts
        self.epoch_size = size if batch_size is None else size // batch_size * batch_size
        self.epoch, self.position = 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def next(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            if self.position >= self.epoch_size:
                self.epoch, self.position = self.epoch + 1, 0
                self._perm = self._permutation()
            out.append(self._perm[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._perm = self._permutation()
