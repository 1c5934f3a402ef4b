"""TRL's precision and speed switches on gtpo's own engine (issue 41, items 1 and 2): ``tf32``,
``gradient_checkpointing_kwargs``, ``torch_compile`` (``_backend``, ``_mode``) and ``vllm_mode`` have TRL's meaning, and
what this machine cannot do is refused before any model loads, naming the field and the file."""

import os

import pytest
import torch
import yaml

from gtpo import GTPOConfig
from gtpo.app.spec import resolve_train_spec, split_spec
from gtpo.app.training import run_training
from gtpo.app.common import RunHooks
from gtpo.cli import main
from gtpo.run import build
from helpers import metrics_lines, write_cli_inputs

NO_TF32 = pytest.mark.skipif(build.tf32_available(), reason="this machine has TF32 (an Ampere+ CUDA GPU)")


def run_cli(path, capsys):
    code = main(["train", "--config", str(path)])
    return code, capsys.readouterr().err


def missing_model(tmp_path):
    """A model path that does not exist: a run that got as far as loading a model would fail naming it."""
    return str(tmp_path / "no-such-model")


# ----------------------------------------------------------------------------- tf32
@NO_TF32
@pytest.mark.parametrize("engine", ["gtpo", "trl"])
def test_tf32_true_is_refused_before_the_model_loads_without_a_tf32_gpu(tmp_path, capsys, engine):
    path = write_cli_inputs(tmp_path, missing_model(tmp_path), tf32=True, engine=engine)
    code, err = run_cli(path, capsys)
    assert code == 2
    assert f"{path}: tf32: true needs an NVIDIA GPU of the Ampere generation" in err
    assert "remove tf32 or set it to false / null" in err
    assert "no-such-model" not in err  # refused before the model (or the dataset) was looked at


@NO_TF32
def test_tf32_true_is_refused_by_the_trainer_too(tiny_model_path, tmp_path):
    """The Python API (GTPOTrainer) refuses it as transformers' TrainingArguments does, before loading."""
    from gtpo import GTPOTrainer

    with pytest.raises(ValueError, match=r"GTPOConfig\.tf32: true needs an NVIDIA GPU"):
        GTPOTrainer(missing_model(tmp_path), lambda completions, **kw: [0.0] * len(completions), [{"prompt": "a"}],
                    args=GTPOConfig(output_dir=str(tmp_path / "run"), tf32=True))


@NO_TF32
def test_tf32_false_trains_without_a_tf32_gpu_and_changes_nothing(tiny_model_path, tmp_path, capsys):
    """transformers: tf32 false where there is no TF32 leaves PyTorch's setting as it is."""
    before = torch.backends.fp32_precision
    path = write_cli_inputs(tmp_path, tiny_model_path, tf32=False)
    code, err = run_cli(path, capsys)
    assert code == 0, err
    assert torch.backends.fp32_precision == before
    assert len(metrics_lines(tmp_path / "out")) == 1


def test_tf32_sets_pytorchs_precision_where_the_gpu_has_it():
    """What the trainer sets on a TF32 GPU (transformers' enable_tf32 on torch >= 2.9), observed on CPU by telling
    apply_tf32 the machine has TF32: true -> 'tf32', false -> 'ieee', None -> unchanged, None with torch_compile ->
    'tf32' (transformers turns it on for compiled kernels); without TF32 nothing changes."""
    saved = torch.backends.fp32_precision
    try:
        torch.backends.fp32_precision = "none"
        assert build.apply_tf32(GTPOConfig(tf32=None), tf32_ok=True) is None
        assert torch.backends.fp32_precision == "none"
        assert build.apply_tf32(GTPOConfig(tf32=True), tf32_ok=True) is True
        assert torch.backends.fp32_precision == "tf32"
        assert build.apply_tf32(GTPOConfig(tf32=False), tf32_ok=True) is False
        assert torch.backends.fp32_precision == "ieee"
        assert build.apply_tf32(GTPOConfig(torch_compile=True), tf32_ok=True) is True
        assert torch.backends.fp32_precision == "tf32"
        assert build.apply_tf32(GTPOConfig(torch_compile=True, tf32=False), tf32_ok=True) is False
        assert torch.backends.fp32_precision == "ieee"
        torch.backends.fp32_precision = "none"
        assert build.apply_tf32(GTPOConfig(tf32=False), tf32_ok=False) is None
        assert torch.backends.fp32_precision == "none"
        with pytest.raises(ValueError, match="GTPOConfig.tf32"):
            build.apply_tf32(GTPOConfig(tf32=True), tf32_ok=False)
    finally:
        torch.backends.fp32_precision = saved


# ----------------------------------------------------------------------------- gradient_checkpointing_kwargs
def _checkpoint_funcs(model):
    """The ``_gradient_checkpointing_func`` of every decoder layer that checkpoints (a functools.partial)."""
    from gtpo.run.models import unwrap_peft

    layers = unwrap_peft(model).get_decoder().layers
    return [layer._gradient_checkpointing_func if layer.gradient_checkpointing else None for layer in layers]


@pytest.mark.parametrize("kwargs, reentrant", [(None, False), ({"use_reentrant": False}, False),
                                                ({"use_reentrant": True}, True)])
def test_gradient_checkpointing_kwargs_reach_torch_checkpoint(tiny_model_path, tmp_path, kwargs, reentrant):
    """End to end (a `gtpo train` YAML through the application layer, the trainer kept by its hook): the
    kwargs arrive in the checkpoint function of every decoder layer; use_reentrant False unless given (TRL's)."""
    extra = {} if kwargs is None else {"gradient_checkpointing_kwargs": kwargs}
    path = write_cli_inputs(tmp_path, tiny_model_path, gradient_checkpointing=True, peft={"r": 2}, **extra)
    seen = []
    spec = resolve_train_spec(path, {})
    assert run_training(spec.spec, source=spec.source, hooks=RunHooks(on_trainer=seen.append)) == 0
    funcs = _checkpoint_funcs(seen[0].unwrapped_model)
    assert funcs and all(f is not None for f in funcs)
    assert {f.func for f in funcs} == {torch.utils.checkpoint.checkpoint}
    assert [f.keywords for f in funcs] == [{"use_reentrant": reentrant}] * len(funcs)
    assert len(metrics_lines(tmp_path / "out")) == 1


def test_gradient_checkpointing_kwargs_every_n_layers_goes_to_transformers(tiny_model_path):
    """every_n_layers / offload are activation_checkpointing_enable's (transformers' Trainer splits them out)."""
    from gtpo.run.models import load_model

    model = load_model(tiny_model_path)
    assert len(model.get_decoder().layers) >= 2
    build.enable_checkpointing(model, {"every_n_layers": 2, "preserve_rng_state": False})
    funcs = _checkpoint_funcs(model)
    assert [f is not None for f in funcs] == [i % 2 == 0 for i in range(len(funcs))]
    assert funcs[0].keywords == {"preserve_rng_state": False, "use_reentrant": False}


@pytest.mark.parametrize("value, words", [({"use_reentrant": "no"}, "gradient_checkpointing_kwargs.use_reentrant "
                                           "must be true or false"),
                                          ({"every_n_layers": 0}, "every_n_layers must be an integer >= 1"),
                                          ("use_reentrant", "must be a mapping of keyword arguments")])
def test_bad_gradient_checkpointing_kwargs_are_refused_at_the_field(tmp_path, capsys, value, words):
    path = write_cli_inputs(tmp_path, missing_model(tmp_path), gradient_checkpointing=True,
                            gradient_checkpointing_kwargs=value)
    code, err = run_cli(path, capsys)
    assert code == 2 and f"{path}: " in err and words in err, err
    assert "no-such-model" not in err


# ----------------------------------------------------------------------------- torch_compile
def test_compile_applies_to_the_training_forward_not_to_sampling(tiny_model_path):
    from gtpo.run.models import load_model
    from gtpo.sampling.policy import PolicyForward

    model = load_model(tiny_model_path)
    assert build.compile_options(GTPOConfig()) is None
    options = build.compile_options(GTPOConfig(torch_compile_mode="default"))  # a mode turns it on (transformers)
    assert options == {"backend": "inductor", "mode": "default"}
    policy = PolicyForward(model, compile=build.compile_options(GTPOConfig(torch_compile_backend="aot_eager")))
    assert policy._compiled is not None and type(model.forward).__name__ == "method"  # the model's own: eager
    assert [n for n, _ in policy.named_modules()] == [n for n, _ in PolicyForward(model).named_modules()]
    ids = torch.randint(0, 50, (4, 9))
    mask, completion = torch.ones_like(ids), ids[:, 5:]
    eager = PolicyForward(model)(ids, mask, completion)
    compiled = policy(ids, mask, completion)
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=0)  # aot_eager: the same kernels


def test_the_compiled_training_forward_is_one_graph(tiny_model_path):
    """The groups of rows sharing a prompt are found outside the compiled body (data-dependent: ``nonzero``), so
    dynamo traces the decoder over the shared prompt cache and the chunked head as one graph; before, the search
    broke it into three."""
    from gtpo.run.models import load_model
    from gtpo.sampling.policy import PolicyForward

    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    model = load_model(tiny_model_path).train()
    prompts = torch.randint(3, 50, (2, 6)).repeat_interleave(3, dim=0)  # 2 prompts x 3 rows: groups to share
    ids = torch.cat([prompts, torch.randint(3, 50, (6, 4))], dim=1)
    mask, completion = torch.ones_like(ids), ids[:, 6:]
    logp, _ = PolicyForward(model, compile={"backend": counting_backend})(ids, mask, completion)
    eager, _ = PolicyForward(model)(ids, mask, completion)
    assert len(graphs) == 1, [g.code for g in graphs]
    torch.testing.assert_close(logp, eager, rtol=0, atol=0)  # the traced graph runs the same kernels
    logp.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_compiled_run_trains_as_the_eager_one(tiny_model_path, tmp_path, capsys):
    """`torch_compile: true` (inductor: this machine has a C++ compiler) gives the eager run's losses and rewards on
    2 steps, within float32 rounding (inductor fuses and reorders float32 reductions)."""
    runs = {}
    for name, extra in (("eager", {}), ("compiled", {"torch_compile": True})):
        d = tmp_path / name
        d.mkdir()
        path = write_cli_inputs(d, tiny_model_path, max_steps=2, learning_rate=1e-2, lr_scheduler_type="constant",
                                **extra)
        code, err = run_cli(path, capsys)
        assert code == 0, err
        runs[name] = metrics_lines(d / "out")
    eager, compiled = runs["eager"], runs["compiled"]
    assert [m["step"] for m in compiled] == [1, 2]
    for a, b in zip(eager, compiled):
        assert b["reward"] == a["reward"]  # same samples: sampling is not compiled
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)
    assert eager[1]["loss"] != eager[0]["loss"]  # the second step ran on updated weights


def test_an_unknown_compile_backend_or_mode_is_refused_before_loading(tmp_path, capsys):
    path = write_cli_inputs(tmp_path, missing_model(tmp_path), torch_compile_backend="inductorr")
    code, err = run_cli(path, capsys)
    assert code == 2 and f"{path}: torch_compile_backend: unknown backend 'inductorr'" in err, err
    assert "'aot_eager'" in err and "no-such-model" not in err
    path = write_cli_inputs(tmp_path, missing_model(tmp_path), torch_compile_mode="fast")
    code, err = run_cli(path, capsys)
    assert code == 2 and "torch_compile_mode must be None or one of ['default', 'reduce-overhead'" in err, err


# ----------------------------------------------------------------------------- vllm_mode
def test_vllm_mode_server_is_refused_on_gtpos_engine_with_the_alternative(tmp_path, capsys):
    path = write_cli_inputs(tmp_path, missing_model(tmp_path), use_vllm=True, vllm_mode="server")
    code, err = run_cli(path, capsys)
    assert code == 2, err
    assert f"{path}: vllm_mode 'server'" in err and "engine: trl" in err and "vllm_server_host" in err
    assert "not installed" not in err and "no-such-model" not in err  # before the vLLM check and the model


def test_vllm_mode_is_accepted_with_trls_meaning(tmp_path):
    """colocate (gtpo's own mode) with use_vllm, and server without use_vllm (no effect, as in TRL), are accepted;
    TRL's engine gets the value as it is."""
    _, config = split_spec({"vllm_mode": "colocate", "use_vllm": True}, source="x.yaml")
    assert config.vllm_mode == "colocate"
    _, config = split_spec({"vllm_mode": "server"}, source="x.yaml")
    assert config.vllm_mode == "server" and not config.use_vllm
    pytest.importorskip("trl")
    from gtpo.integrations.trl import TRLGTPOConfig

    for mode in ("colocate", "server"):
        args = TRLGTPOConfig.from_gtpo_config(GTPOConfig(vllm_mode=mode, output_dir=str(tmp_path)), use_cpu=True)
        assert args.vllm_mode == mode


def test_trls_engine_gets_the_switches_as_they_are(tmp_path):
    pytest.importorskip("trl")
    from gtpo.integrations.trl import TRLGTPOConfig

    config = GTPOConfig(output_dir=str(tmp_path), gradient_checkpointing=True,
                        gradient_checkpointing_kwargs={"use_reentrant": True}, torch_compile_backend="aot_eager",
                        tf32=False)
    args = TRLGTPOConfig.from_gtpo_config(config, use_cpu=True)
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": True}
    assert args.torch_compile and args.torch_compile_backend == "aot_eager"
    assert args.tf32 is False
