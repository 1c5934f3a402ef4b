"""The accelerate configs a user launches with (this repository's ``configs/accelerate/`` and TRL's shipped
``trl/accelerate_configs/``), read by accelerate's and DeepSpeed's own parsing rather than by ours (issue 43): the
config file loader, ``accelerate launch``'s validation and the environment it hands the processes, and accelerate's
``DeepSpeedPlugin`` (which builds the DeepSpeed JSON config the engine gets). FSDP's plugin refuses to be built on a
CPU (``sync_module_states``), so FSDP configs are checked as far as the launcher's environment; they train in the GPU
check (``bench/gpu_check.py``, part ``sharded``), and ZeRO-2/3 train on DeepSpeed's CPU accelerator in
``.venv-gpuversions`` (docs/gpu.md)."""

from __future__ import annotations

import glob
import inspect
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config_files():
    import trl

    ours = sorted(glob.glob(os.path.join(ROOT, "configs", "accelerate", "*.yaml")))
    shipped = sorted(glob.glob(os.path.join(os.path.dirname(trl.__file__), "accelerate_configs", "*.yaml")))
    assert ours and shipped
    return ours + shipped


@pytest.mark.parametrize("path", config_files(), ids=os.path.basename)
def test_accelerate_reads_the_config_and_launch_accepts_it(path):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DistributedType
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    config = load_config_from_file(path)
    assert isinstance(config, ClusterConfig) and isinstance(config.distributed_type, DistributedType)
    assert config.num_processes >= 1 and 0 <= config.machine_rank < config.num_machines
    args = launch_command_parser().parse_args(["--config_file", path, "train.py"])
    _validate_launch_command(args)  # accelerate launch's own checks of the file's values
    if config.distributed_type == DistributedType.DEEPSPEED:
        args.deepspeed_fields_from_accelerate_config = []  # launch_command fills it from the file before this call
        _, env = prepare_deepspeed_cmd_env(args)
        assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == str(config.deepspeed_config["zero_stage"])
    elif config.distributed_type == DistributedType.FSDP:
        env = prepare_multi_gpu_env(args)
        assert env["ACCELERATE_USE_FSDP"] == "true"
        assert env["FSDP_VERSION"] == str(config.fsdp_config.get("fsdp_version", 1))
    elif config.num_processes > 1:
        env = prepare_multi_gpu_env(args)
        assert env.get("ACCELERATE_USE_FSDP", "false") == "false" and env["ACCELERATE_MIXED_PRECISION"] == \
            config.mixed_precision


@pytest.mark.parametrize("path", [p for p in config_files() if "zero" in os.path.basename(p)], ids=os.path.basename)
def test_deepspeed_plugin_builds_the_engine_config(path):
    """accelerate's DeepSpeedPlugin from the file's deepspeed_config (what `accelerate launch` hands the processes):
    the ZeRO stage and offload devices reach the DeepSpeed JSON config; ``auto`` values are left for the trainer."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin

    ds = load_config_from_file(path).deepspeed_config
    fields = inspect.signature(DeepSpeedPlugin).parameters
    plugin = DeepSpeedPlugin(**{k: v for k, v in ds.items() if k in fields})
    zero = plugin.deepspeed_config["zero_optimization"]
    assert zero["stage"] == ds["zero_stage"] == plugin.zero_stage
    assert zero.get("offload_optimizer", {}).get("device", "none") == ds.get("offload_optimizer_device", "none")
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == "auto"
    if ds["zero_stage"] == 3:
        assert zero.get("offload_param", {}).get("device", "none") == ds.get("offload_param_device", "none")
