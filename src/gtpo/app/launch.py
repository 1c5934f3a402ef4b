"""``accelerate launch`` options in a run's YAML, as ``trl grpo`` takes them: ``num_processes: 4``,
``accelerate_config: zero2`` (a path, or the name of a config shipped in ``trl/accelerate_configs``), ``num_machines``,
``main_process_port``, ... A spec that holds any of them is started again under ``accelerate launch`` with those
options (:func:`relaunch`); the launched processes read the same YAML and ignore them. No torch here.

What goes to the launcher is decided as TRL's CLI decides it: a key that neither gtpo nor TRL's ``GRPOConfig`` takes
and that is an option of ``accelerate launch`` (``gradient_accumulation_steps`` and ``debug``, options of both, stay
the trainer's).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..errors import ConfigError
from .launch_names import launch_option_names

logger = logging.getLogger("gtpo")

__all__ = ["LAUNCHED_ENV", "check_machines", "launch_option_names", "launched", "relaunch", "split_launch_options",
           "trainer_keys"]

#: set for the processes gtpo started under ``accelerate launch``: they train, they do not launch again
LAUNCHED_ENV = "GTPO_ACCELERATE_LAUNCHED"
def _config_file(value: Any, source: str) -> str:
    """``accelerate_config``: a file, or the name of one of TRL's shipped configs (``zero2`` ->
    ``trl/accelerate_configs/zero2.yaml``), as ``trl grpo`` resolves it."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{source}: accelerate_config must be a path or a config name, got {value!r}")
    if os.path.isfile(value):
        return value
    try:
        from importlib import resources

        candidate = resources.files("trl.accelerate_configs").joinpath(f"{value}.yaml")
        if candidate.is_file():
            return str(candidate)
        shipped = sorted(p.name[:-5] for p in resources.files("trl.accelerate_configs").iterdir()
                         if p.name.endswith(".yaml"))
    except ModuleNotFoundError:
        shipped = []
    names = f" or one of TRL's configs ({', '.join(shipped)})" if shipped else " (TRL's named configs need trl)"
    raise ConfigError(f"{source}: accelerate_config {value!r} is neither a file{names}")


def trainer_keys() -> frozenset[str]:
    """The keys the trainers read (gtpo's fields and run keys, the TRL keys gtpo maps, TRL's options)."""
    from ..config import GTPOConfig
    from ..integrations import trl_option_names
    from .spec import RunSpec
    from .trl_names import TRL_SPEC_KEYS

    return frozenset(GTPOConfig.field_names()) | frozenset(RunSpec.key_names()) | frozenset(TRL_SPEC_KEYS) \
        | trl_option_names()


def split_launch_options(spec: dict[str, Any], *, source: str,
                         taken: set[str] | frozenset[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """``(spec without the launcher's keys, the arguments of accelerate launch)``. ``taken``: the keys the trainers
    read (default :func:`trainer_keys`), which stay in the spec. A boolean option is a flag (``cpu: true`` ->
    ``--cpu``; false: left out)."""
    taken = trainer_keys() if taken is None else taken
    launch_names = launch_option_names()
    rest, args = {}, []
    for key, value in spec.items():
        if key in taken or key not in launch_names:
            rest[key] = value
        elif key == "accelerate_config":
            args = ["--config_file", _config_file(value, source)] + args
        elif isinstance(value, bool):
            args += [f"--{key}"] if value else []
        elif value is not None:
            args += [f"--{key}", str(value)]
    return rest, args


def check_machines(spec: dict[str, Any], *, source: str) -> None:
    """Refuse, before any process starts, what ``accelerate launch`` would only find out by waiting at the rendezvous:
    ``machine_rank`` outside ``0 .. num_machines - 1`` (the YAML's keys over its ``accelerate_config`` file's) and a
    ``main_process_port`` outside 1-65535 (a port in use accelerate launch refuses itself: :func:`relaunch`)."""
    values: dict[str, Any] = {}
    config = spec.get("accelerate_config")
    if isinstance(config, str) and os.path.isfile(config):
        import yaml

        with open(config) as fh:
            values.update(yaml.safe_load(fh) or {})
    values.update({k: v for k, v in spec.items() if v is not None})
    try:
        machines = int(values.get("num_machines", 1))
        rank = int(values.get("machine_rank", 0))
        port = None if values.get("main_process_port") is None else int(values["main_process_port"])
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: num_machines, machine_rank and main_process_port must be integers ({err})") \
            from None
    if machines < 1:
        raise ConfigError(f"{source}: num_machines must be at least 1, got {machines}")
    if not 0 <= rank < machines:
        raise ConfigError(f"{source}: machine_rank {rank} is out of range for num_machines {machines}: the machines "
                          f"are ranked 0 to {machines - 1} (0 is the main node, whose main_process_ip the others "
                          "reach); accelerate launch would wait at the rendezvous for a node that never comes")
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"{source}: main_process_port {port} is not a TCP port (1-65535)")


def launched() -> bool:
    """Whether this process was started by :func:`relaunch` (it trains; the YAML's launch options are done)."""
    return os.environ.get(LAUNCHED_ENV) == "1"


def relaunch(launch_args: list[str], argv: list[str]) -> int:
    """Run ``accelerate launch <launch_args> -m gtpo.cli train <argv>`` and wait; its exit status. The launched
    processes see :data:`LAUNCHED_ENV` and train."""
    import subprocess

    from accelerate.commands.launch import launch_command, launch_command_parser

    logger.info("launching with accelerate: accelerate launch %s -m gtpo.cli train %s", " ".join(launch_args),
                " ".join(argv))
    args = launch_command_parser().parse_args(launch_args + ["--module", "gtpo.cli", "train"] + list(argv))
    os.environ[LAUNCHED_ENV] = "1"
    try:
        launch_command(args)
    except subprocess.CalledProcessError as err:
        return err.returncode or 1
    except (ConnectionError, ValueError) as err:  # accelerate's refusals (a port in use, ...): its message, no trace
        raise ConfigError(f"accelerate launch {' '.join(launch_args)}: {err}") from None
    finally:
        os.environ.pop(LAUNCHED_ENV, None)
    return 0
