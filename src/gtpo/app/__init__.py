"""The application layer: a training job from a spec (``gtpo train``, ``gtpo sft``), for the CLI and for scripts.

``gtpo.cli`` parses arguments and calls this package; experiments and benchmarks call it directly::

    from gtpo.app import RunHooks, parse_overrides, resolve_train_spec, run_training

    spec, source, options = resolve_train_spec(None, parse_overrides(["--seed", "1"]), demo=True)
    run_training(spec, source=source, options=options, hooks=RunHooks(accuracy=my_accuracy))

* :mod:`gtpo.app.spec`: the spec (YAML + overrides + preset), validated into a RunSpec (the run keys) and a
  GTPOConfig;
* :mod:`gtpo.app.common`: a run's inputs and hooks, datasets and LoRA from a spec, the accuracy, summary, report;
* :mod:`gtpo.app.training`: loading a run's inputs, gtpo's trainer, accuracy before/after, the resume command;
* :mod:`gtpo.app.trl_run`: the same on TRL's engine (``engine: trl``);
* :mod:`gtpo.app.model_checks`: the model settings libraries check only when a model loads (LoRA values,
  quantization, attention implementation, a float16 load), refused before any model loads;
* :mod:`gtpo.app.sft`: ``gtpo sft``'s job.
"""

from __future__ import annotations

from .spec import (DATASET_KEYS, ENGINES, PEFT_KEYS, SFT_KEYS, RunSpec, TrainSpec, apply_overrides, default_config_text,
                   load_yaml, parse_overrides, parse_value, resolve_train_spec, split_spec, typed_values)
from .common import (RunHooks, RunInputs, build_peft_config, finish_run, greedy_accuracy, load_dataset_spec,
                     write_summary_and_report)
from .training import load_run_inputs, resume_command, run_training, sft_warmup

__all__ = ["DATASET_KEYS", "ENGINES", "PEFT_KEYS", "RunHooks", "RunInputs", "RunSpec", "SFT_KEYS",
           "TrainSpec", "apply_overrides", "build_peft_config", "default_config_text", "finish_run",
           "greedy_accuracy", "load_dataset_spec", "load_run_inputs", "load_yaml", "parse_overrides", "parse_value",
           "resolve_train_spec", "resume_command", "run_training", "sft_warmup", "split_spec",
           "typed_values", "write_summary_and_report"]
