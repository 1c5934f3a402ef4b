"""What gtpo's own engine does with each option of a YAML written for ``trl grpo``: one verdict per name, the table of
``docs/trl-yaml.md`` generated from it (``scripts/gen_trl_yaml_table.py``) and :func:`split_spec` acting on it.

A TRL YAML holds ``trl.GRPOConfig`` options, ``ModelConfig`` fields and ``trl grpo``'s script arguments. On gtpo's
engine each name is one of:

- ``same``: a :class:`gtpo.GTPOConfig` field (declared with ``trl="same"``, ``"when_set"`` or ``"converted"``) or a
  run key (:class:`gtpo.app.spec.RunSpec`) of the same name and meaning; ``"converted"`` fields differ in a unit
  (:data:`CONVERTED_NOTES` says how);
- ``mapped``: TRL's name of a gtpo key (a field declared ``trl="renamed"``, or the script and model keys
  :mod:`gtpo.app.trl_names` rewrites);
- ``no_effect``: accepted and ignored, because the mechanism it tunes does not exist in gtpo's trainer
  (:data:`NO_EFFECT`; some only with the value that means TRL's default behaviour, :data:`ACCEPTED_VALUES`);
- ``refused``: refused before any model loads, with the reason and what to do (:data:`REFUSED`; any other
  ``GRPOConfig`` option: :data:`TRL_ENGINE_ONLY`, train it with ``engine: trl``) -- unless the file gives it TRL's
  default value, which asks for nothing (the feature off, or what gtpo's trainer does anyway): a file written out
  from a whole ``GRPOConfig`` trains.

No torch and no TRL here: the verdicts hold whether or not TRL is installed.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, NamedTuple

from ..config import GTPOConfig
from ..errors import ConfigError

logger = logging.getLogger("gtpo")

__all__ = ["ACCEPTED_VALUES", "CONVERTED_NOTES", "NO_EFFECT", "REFUSED", "TRL_ENGINE_ONLY", "Verdict",
           "apply_on_gtpo_engine", "gtpo_engine_verdict"]

#: the alternative every refusal can offer: TRL's own trainer with GTPO's loss
TRL_ENGINE_ONLY = "train this file with `engine: trl` (--engine trl): TRL's GRPOTrainer with GTPO's loss takes every " \
                  "trl.GRPOConfig option"

_NO_LOADER = "gtpo's trainer takes its prompts from memory (a seeded permutation per epoch), without a torch DataLoader"
_NO_PREDICTION_LOOP = "gtpo's evaluation generates and scores completions; the HF Trainer's prediction loop it tunes " \
                      "does not run"

#: TRL options gtpo's engine accepts and ignores: why they change nothing there
NO_EFFECT: dict[str, str] = {
    "dataloader_num_workers": _NO_LOADER,
    "dataloader_pin_memory": _NO_LOADER,
    "dataloader_persistent_workers": _NO_LOADER,
    "dataloader_prefetch_factor": _NO_LOADER,
    "dataloader_multiprocessing_context": _NO_LOADER,
    "dataloader_drop_last": "TRL's sampler drops an incomplete last batch whatever this says, and so does gtpo's "
                            "epoch count",
    "dataloader_in_order": _NO_LOADER,
    "do_train": "a flag for the HF example scripts; the HF Trainer does not read it either",
    "do_eval": "a flag for the HF example scripts; evaluation runs by eval_strategy",
    "do_predict": "a flag for the HF example scripts; the HF Trainer does not read it either",
    "local_rank": "set by the launcher (accelerate launch / torchrun), read from the environment",
    "prediction_loss_only": _NO_PREDICTION_LOOP,
    "eval_accumulation_steps": _NO_PREDICTION_LOOP,
    "eval_do_concat_batches": _NO_PREDICTION_LOOP,
    "eval_use_gather_object": _NO_PREDICTION_LOOP,
    "include_for_metrics": _NO_PREDICTION_LOOP,
    "batch_eval_metrics": _NO_PREDICTION_LOOP,
    "skip_memory_metrics": "gtpo's trainer logs no HF memory metrics",
    "restore_callback_states_from_checkpoint": "gtpo's trainer has no HF callbacks; a resume restores its whole loop "
                                               "state",
    "logging_nan_inf_filter": "gtpo's trainer never applies a non-finite update; it skips and counts it "
                              "(max_consecutive_skips)",
    "ds3_gather_for_generation": "DeepSpeed does not run on gtpo's engine",
    "log_on_each_node": "gtpo's trainer logs from the main process",
    "use_cache": "the rollout always decodes with a KV cache and the training forward never builds one",
    "average_tokens_across_devices": "gtpo's loss already divides by the whole batch's token count across processes",
}

#: TRL options gtpo's engine accepts with one value only (the behaviour gtpo's trainer has): (value, why)
ACCEPTED_VALUES: dict[str, tuple[Any, str]] = {
    "shuffle_dataset": (True, "gtpo's trainer always shuffles the prompts (a seeded permutation per epoch)"),
    "multi_objective_aggregation": ("sum_then_normalize", "gtpo sums the weighted rewards, then computes group "
                                                          "advantages"),
    "remove_unused_columns": (False, "every dataset column reaches the reward functions as keyword arguments, as "
                                     "with TRL's default"),
    "logging_strategy": ("steps", "gtpo's trainer logs every logging_steps steps"),
    "log_level_replica": ("warning", "gtpo's trainer logs from the main process only"),
}

#: TRL options gtpo's engine refuses with a reason of their own (and the alternative); every other GRPOConfig option
#: is refused with :data:`TRL_ENGINE_ONLY`
REFUSED: dict[str, str] = {
    "fp16": "float16 training (with a loss scaler) is not supported by gtpo's trainer: set bf16: true (or dtype: "
            "bfloat16), or train with engine: trl",
    "deepspeed": "DeepSpeed runs on TRL's engine: engine: trl with `accelerate launch --config_file <zero3.yaml>` "
                 "(docs/gpu.md)",
    "fsdp": "FSDP runs on TRL's engine: engine: trl with `accelerate launch --config_file <fsdp2.yaml>` (docs/gpu.md)",
    "fsdp_config": "FSDP runs on TRL's engine: engine: trl with `accelerate launch --config_file <fsdp2.yaml>` "
                   "(docs/gpu.md)",
    "use_liger_kernel": "Liger's fused GRPO loss computes GRPO's loss, not GTPO's; gtpo's trainer bounds the "
                        "log-prob memory with logprob_chunk_size instead",
    "liger_kernel_config": "Liger's fused GRPO loss computes GRPO's loss, not GTPO's; gtpo's trainer bounds the "
                           "log-prob memory with logprob_chunk_size instead",
    "load_best_model_at_end": "gtpo's trainer keeps the last model, it does not rank checkpoints by a metric: pick "
                              "one from output_dir/checkpoint-*, or train with engine: trl",
    "metric_for_best_model": "gtpo's trainer keeps the last model, it does not rank checkpoints by a metric: pick "
                             "one from output_dir/checkpoint-*, or train with engine: trl",
    "use_cpu": "gtpo's trainer uses the GPU when there is one and the CPU otherwise: to train on the CPU of a GPU "
               "machine, hide the GPUs (CUDA_VISIBLE_DEVICES= gtpo train ...)",
    "vllm_server_host": "gtpo's trainer runs vLLM in its own process (vllm_mode colocate); a `trl vllm-serve` "
                        "server needs engine: trl",
    "vllm_server_port": "gtpo's trainer runs vLLM in its own process (vllm_mode colocate); a `trl vllm-serve` "
                        "server needs engine: trl",
    "vllm_server_base_url": "gtpo's trainer runs vLLM in its own process (vllm_mode colocate); a `trl vllm-serve` "
                            "server needs engine: trl",
    "vllm_tensor_parallel_size": "gtpo's trainer runs one vLLM engine per process without tensor parallelism: "
                                 "engine: trl",
}
REFUSED["save_on_each_node"] = "gtpo's trainer saves from the main process into one output_dir that every node must " \
                               "see (a shared file system; docs/gpu.md, several nodes): for a copy on each node's " \
                               "own disk, train with engine: trl"
REFUSED["datasets"] = "TRL's dataset mixtures are not supported (on either engine): give one dataset as dataset_name"
REFUSED["dataset_streaming"] = "the dataset is loaded whole (on either engine): save a local copy with " \
                               "datasets.load_dataset(...).save_to_disk(DIR) and give DIR as dataset_name"
_LOSS_VARIANT = "a loss variant of TRL's GRPOTrainer; gtpo's trainer trains the losses of loss_type (gtpo, grpo, " \
                "dr_grpo, dapo): train it with engine: trl"
for _name in ("delta", "importance_sampling_level", "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos",
              "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "top_entropy_quantile", "entropy_coef",
              "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target",
              "off_policy_mask_threshold", "use_bias_correction_kl"):
    REFUSED[_name] = _LOSS_VARIANT

#: how a GTPOConfig field declared trl="converted" differs between the engines (the TRL-YAML table's note);
#: tests/test_trl_options.py fails on a converted field without one
CONVERTED_NOTES: dict[str, str] = {
    "max_steps": "-1: num_train_epochs decide (a TRL YAML without max_steps too); rollout steps on gtpo's engine (each "
                 "with num_iterations updates), optimizer steps on TRL's: equal with num_iterations: 1",
    "loss_type": "gtpo's default is gtpo (TRL's: dapo); grpo, dr_grpo and dapo mean TRL's losses",
    "num_generations": "TRL's name of group_size",
    "generation_batch_size": "TRL's rollout batch in completions: prompts_per_step x group_size on gtpo's engine, "
                             "which makes one update per generation (it must equal per_device_train_batch_size x "
                             "gradient_accumulation_steps x processes)",
    "scale_rewards": "TRL's group / batch / none; gtpo's default follows loss_type",
    "warmup_steps": "an integer number of steps, or a float below 1 for a ratio of max_steps (TRL's rule)",
    "model_init_kwargs": "passed to from_pretrained on both; TRL's dtype strings accepted",
    "bf16": "bf16 compute on both; gtpo loads the weights in bf16 too unless dtype says otherwise (docs/gpu.md)",
    "report_to": "none, tensorboard, wandb, trackio (a string or a list)",
    "save_steps": "counted in rollout steps on gtpo's engine (optimizer steps on TRL's): equal with num_iterations: 1",
    "eval_steps": "unset: logging_steps (TRL's rule); counted like save_steps",
    "eval_strategy": "no, steps, epoch as TRL (evaluation also after the last step); unset, a gtpo YAML with "
                     "eval_steps evaluates (steps), a TRL YAML does not (TRL's no)",
    "per_device_eval_batch_size": "the generation batch of gtpo's evaluation, whose metrics are its own eval/* "
                                  "(pass@k, accuracy), not TRL's eval loss and rewards",
    "save_strategy": "no, steps, epoch as TRL; steps with save_steps: 0 is no; best only on TRL's engine (gtpo's "
                     "trainer does not rank checkpoints by a metric)",
}


#: GTPOConfig fields of TRL's names where TRL's default is None (TRL decides then): a YAML's null means gtpo's
#: default, which is gtpo's decision of the same thing
NULL_MEANS_DEFAULT = ("output_dir", "bf16", "disable_tqdm", "num_completions_to_print")


def drop_trl_nulls(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` without the ``null`` values of :data:`NULL_MEANS_DEFAULT` (TRL's "decide for me"), on both engines."""
    return {k: v for k, v in spec.items() if not (v is None and k in NULL_MEANS_DEFAULT)}


class Verdict(NamedTuple):
    """What gtpo's engine does with a TRL option: ``kind`` (same, mapped, no_effect, refused) and ``note`` (the
    difference, the gtpo name, or the reason and the alternative)."""

    kind: str
    note: str


def _mapped_keys() -> dict[str, str]:
    """TRL's names gtpo maps: ``{trl name: gtpo name or what it becomes}``."""
    from ..config import fields_where
    from .trl_names import TRL_MAPPED_TO

    fields = {f.name: f for f in dataclasses.fields(GTPOConfig)}
    out = {fields[n].metadata["trl_name"]: n for n in fields_where("trl", "renamed")
           if fields[n].metadata["trl_name"].isidentifier()}
    out.update(TRL_MAPPED_TO)
    return out


def gtpo_engine_verdict(name: str, value: Any = None, *, run_keys: tuple[str, ...] | list[str] = ()) -> Verdict:
    """The verdict of gtpo's engine on the TRL option ``name`` (with ``value``, for :data:`ACCEPTED_VALUES`);
    ``run_keys``: the run keys of a spec (:meth:`gtpo.app.spec.RunSpec.key_names`; same name, same meaning)."""
    fields = {f.name: f for f in dataclasses.fields(GTPOConfig)}
    if name in fields and fields[name].metadata.get("trl") in ("same", "when_set", "converted"):
        return Verdict("same", CONVERTED_NOTES.get(name, "") if fields[name].metadata["trl"] == "converted" else "")
    if name in run_keys:
        return Verdict("same", "")
    mapped = _mapped_keys()
    if name in mapped:
        return Verdict("mapped", mapped[name])
    if name in NO_EFFECT:
        return Verdict("no_effect", NO_EFFECT[name])
    if name in ACCEPTED_VALUES:
        accepted, why = ACCEPTED_VALUES[name]
        if value is None or value == accepted:
            return Verdict("no_effect", f"only {accepted!r}: {why}")
        return Verdict("refused", f"only {accepted!r} on gtpo's engine ({why}); for {value!r}, "
                                  f"{TRL_ENGINE_ONLY}")
    if name in REFUSED:
        return Verdict("refused", REFUSED[name])
    return Verdict("refused", TRL_ENGINE_ONLY)


def apply_on_gtpo_engine(spec: dict[str, Any], *, known: set[str], where: Callable[[str], str],
                         trl_names: frozenset[str], trl_defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """``spec`` without the TRL options gtpo's engine ignores (:data:`NO_EFFECT`, :data:`ACCEPTED_VALUES`; logged
    once); a refused one raises, naming it, why and what to do. ``known``: the keys gtpo's engine takes as they are;
    ``trl_names``: ``trl.GRPOConfig``'s fields where TRL is installed (else the names this module knows);
    ``trl_defaults``: their defaults (an option at its default is ignored, whatever its verdict).

    Raises:
        ConfigError: ``'<file or --option>: <name> is not taken by gtpo's trainer: <reason>'``.
    """
    out, ignored = {}, []
    for key, value in spec.items():
        if key in known:
            out[key] = value
            continue
        listed = key in NO_EFFECT or key in ACCEPTED_VALUES or key in REFUSED
        if not listed and key not in trl_names:
            out[key] = value  # not TRL's: the caller's unknown-key error names it
            continue
        verdict = gtpo_engine_verdict(key, value)
        at_default = trl_defaults is not None and key in trl_defaults and _same_value(value, trl_defaults[key])
        if verdict.kind == "refused" and not at_default:
            raise ConfigError(f"{where(key)}: {key} is not taken by gtpo's trainer: {verdict.note}")
        ignored.append(key)
    if ignored:
        logger.info("TRL options with no effect on gtpo's trainer, ignored: %s (docs/trl-yaml.md says why)",
                    ", ".join(ignored))
    return out


def _same_value(value: Any, default: Any) -> bool:
    """Whether a YAML value is TRL's default (``1`` for ``1.0``, but never ``1`` for ``True``; an empty list, mapping
    or string for None)."""
    if default is None:
        return value is None or value in ([], {}, "")
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool) and value == default
    return value == default
