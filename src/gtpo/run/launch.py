"""What a launcher asked for against what accelerate formed, checked before any model loads (docs/gpu.md,
"Several GPUs / several nodes").

``accelerate launch`` (and torchrun) start the processes and export what the accelerate config asked for; accelerate
then builds the process state from what the machine has. The two can differ without an error from accelerate
(accelerate 1.x on a machine without GPUs):

- a config with ``use_cpu: false`` (TRL's ``fsdp2.yaml``, ``multi_gpu.yaml``) launched with ``num_processes: 2`` starts
  two processes (``WORLD_SIZE=2``) whose state each says ``DistributedType.NO``, process 0 of 1: each trains the
  whole batch alone as "the main process" and both write ``output_dir``;
- with ``use_cpu: true`` the FSDP config becomes plain CPU DDP (``MULTI_CPU``): every process holds the whole model.

:func:`check_launch` refuses both, naming what was asked and what would run. :func:`process_group_kwargs` is the
process-group timeout of a run (``GTPOConfig.ddp_timeout``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Mapping

__all__ = ["check_launch", "launched_world_size", "process_group_kwargs", "requested_distributed_type",
           "would_run"]

#: accelerate launch's environment variable for each sharded setup of an accelerate config's distributed_type
_REQUEST_FLAGS = (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DEEPSPEED"),
                  ("ACCELERATE_USE_MEGATRON_LM", "MEGATRON_LM"))


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "false").strip().lower() in ("1", "true", "yes")


def requested_distributed_type(environ: Mapping[str, str] | None = None) -> str | None:
    """The sharded setup the launcher asked for (``"FSDP"``, ``"DEEPSPEED"``, ``"MEGATRON_LM"``: an accelerate config's
    ``distributed_type``, exported by ``accelerate launch`` as ``ACCELERATE_USE_<TYPE>=true``), or None."""
    environ = os.environ if environ is None else environ
    return next((name for flag, name in _REQUEST_FLAGS if _flag(environ, flag)), None)


def launched_world_size(environ: Mapping[str, str] | None = None) -> int:
    """How many processes the launcher started (``WORLD_SIZE``; 1 when unset or unreadable)."""
    environ = os.environ if environ is None else environ
    try:
        return max(1, int(environ.get("WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


def _type_name(distributed_type) -> str:
    return str(getattr(distributed_type, "value", distributed_type)).upper()


def would_run(state, asked: str | None) -> str:
    """What accelerate runs for a launch that asked for ``asked`` given the process state ``state`` (an
    ``accelerate.PartialState`` or ``AcceleratorState``): its ``distributed_type``, except that a process state which
    the accelerator turns into the sharded setup is named as that setup (accelerate's rule: FSDP on several accelerator
    processes, ``MULTI_GPU``/``MULTI_XPU``/..., never on CPU processes; DeepSpeed where the state is DeepSpeed's or,
    for one process, off the CPU)."""
    running = _type_name(state.distributed_type)
    if asked == running:
        return running
    accelerated = running.startswith("MULTI_") and running != "MULTI_CPU"
    if asked in ("FSDP", "MEGATRON_LM") and accelerated:
        return asked
    if asked == "DEEPSPEED" and running == "NO" and not getattr(state, "_cpu", False) \
            and getattr(getattr(state, "device", None), "type", "cpu") != "cpu":
        return asked
    return running


def check_launch(state, *, engine: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a launch whose processes did not form the run it asked for (ValueError, before any model loads):

    - the launcher started ``WORLD_SIZE`` > 1 processes but ``state`` counts another number (no process group
      formed: each process would train alone and write ``output_dir`` at the same time);
    - the launcher asked for FSDP / DeepSpeed (its accelerate config's ``distributed_type``) and accelerate would run
      something else (plain DDP, or one process): refused rather than warned, since a run that holds the whole model
      in every process is not the run the config describes (it needs several times the memory, and on CPU FSDP
      never shards), and a warning among the logs of N processes is easily missed; the fix is one line.

    ``engine``: ``"gtpo"`` (gtpo's own trainer, which takes plain DDP only: FSDP/DeepSpeed are refused by
    :func:`gtpo.run.build.check_distributed_type` with its own message) or ``"trl"``."""
    environ = os.environ if environ is None else environ
    world, asked = launched_world_size(environ), requested_distributed_type(environ)
    running = would_run(state, asked)
    ddp_fix = ("accelerate launch --config_file configs/accelerate/cpu_ddp_2proc.yaml (plain DDP over CPU processes; "
               "--num_processes N for N)")
    on_cpu = getattr(state, "device", None) is not None and state.device.type == "cpu"
    if world > 1 and state.num_processes != world:
        rank = environ.get("RANK", "?")
        if not on_cpu:
            cause = "the processes do not each see an accelerator (check CUDA_VISIBLE_DEVICES)"
        elif engine == "trl":
            cause = ("the processes are on CPU and TRL's use_cpu is false (set in the YAML; gtpo sets it to true on a "
                     "machine without GPUs): TRL forms a CPU process group only with use_cpu: true")
        else:
            cause = "the processes are on CPU and accelerate's process state was made without cpu=True"
        raise ValueError(
            f"{world} processes were launched (WORLD_SIZE={world}, this is RANK {rank}) but accelerate formed no "
            f"process group: this process runs as process {state.process_index} of {state.num_processes} "
            f"({running}), so every process would train the whole batch alone and write output_dir at the same "
            f"time. Cause: {cause}. Fix: " + ("remove use_cpu: false from the YAML (or set it to true)"
                                               if engine == "trl" and on_cpu else
                                               f"on CPU, launch with {ddp_fix}; with GPUs, make every process see one")
            + "."
        )
    if asked is not None and engine == "gtpo":  # refused whatever runs, with gtpo's alternatives
        from .build import check_distributed_type

        check_distributed_type(asked, running=running)
    if asked is None or running == asked:
        return
    raise ValueError(
        f"the accelerate config asks for {asked} (accelerate launch set ACCELERATE_USE_{asked}=true) but accelerate "
        f"would run {running} with {state.num_processes} process(es): every process would hold the whole model, "
        f"nothing sharded. accelerate shards with {asked} only on GPUs/accelerators"
        + (", which this machine does not have" if on_cpu else ", and these processes formed no accelerator group")
        + f". Fix: on CPU run plain DDP ({ddp_fix}); on GPUs launch the {asked} config with every process seeing a GPU"
        + (". DeepSpeed's own CPU accelerator runs ZeRO on CPU processes (engine: trl): install deepspeed, set "
           "use_cpu: false in the YAML (gtpo sets TRL's use_cpu to true on a machine without GPUs) and "
           "DS_ACCELERATOR=cpu in the environment (docs/gpu.md)" if asked == "DEEPSPEED" and on_cpu else "")
        + "."
    )


def process_group_kwargs(ddp_timeout: int) -> dict:
    """The keyword arguments of the run's process state (``accelerate.PartialState(**kwargs)``, passed on to
    ``torch.distributed.init_process_group``): its collectives' timeout, ``ddp_timeout`` seconds."""
    return {"timeout": timedelta(seconds=ddp_timeout)}
