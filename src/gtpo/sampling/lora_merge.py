"""LoRA adapters merged into dense weights without changing the model.

A peft LoRA linear layer computes ``base(x) + scale * B(A(x))``: per token three matmuls and an
add where the merged layer computes one, ``x @ (W + scale * B @ A)^T``. During sampling, where the
weights do not change, that is wasted work: the two rank-r matmuls are small, but they are 2 of 3
kernel calls per layer (420 extra calls per token for SmolLM2's 210 adapted layers), which a
small-batch decoding step pays for in full. :func:`merged_lora_layers` swaps each eligible LoRA
layer for a plain ``torch.nn.Linear`` holding the merged weight for the duration of a block and
puts the original layers back after: the trained weights are never touched (no merge/unmerge
rounding accumulates in them, and resuming stays exact), at the cost of one copy of the adapted
weights while the block runs. :func:`lora_merged_weight` is the merged weight of one layer (also
what :mod:`gtpo.sampling.vllm_engine` sends vLLM).

The merged layer's output equals the LoRA layer's up to float rounding (the sum is formed in the
weights instead of in the activations). That is why only float32/float64 base weights are merged
by default: a bfloat16 weight plus a delta a thousand times smaller is rounded back to almost the
base weight (bfloat16 keeps 8 significant bits), so the sampler would drift from the policy.
vLLM's engine (:mod:`gtpo.sampling.vllm_engine`) does receive bfloat16 merged weights in a bf16 LoRA
run: :class:`MergeRounding` counts the delta entries the rounding drops (``round(W + d) == round(W)``
while ``d != 0``: ``|d|`` below half of the dtype's spacing at ``W``, 2^-8 |W| for bfloat16) and the
engine logs it once (docs/gpu.md, "vLLM", for measured fractions).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

__all__ = ["MERGE_DTYPES", "MergeRounding", "dense_base_weight", "is_bnb_layer", "lora_merged_weight",
           "mergeable_lora_layers", "merged_lora_layers"]

#: base-weight dtypes whose merged weights :func:`merged_lora_layers` uses by default
MERGE_DTYPES = (torch.float32, torch.float64)


logger = logging.getLogger(__name__)


class MergeRounding:
    """What rounding merged LoRA weights to a low-precision dtype (bfloat16, float16) dropped.

    :meth:`add` counts, per merged weight, the delta entries ``d != 0`` whose merged value rounds back
    to the base weight (``round(W + d) == round(W)``: lost entirely) and their share of the delta's
    squared norm; :meth:`warn_once` logs one warning naming ``where``, the dtype and the fractions the
    first time any entry was lost. Float32/float64 merges are not counted (nothing below their
    spacing matters next to the activations' rounding).
    """

    LOW_PRECISION = (torch.bfloat16, torch.float16)

    def __init__(self, where: str):
        self.where = where
        self.warned = False
        self.dtype: torch.dtype | None = None
        self.entries = 0  # non-zero delta entries merged in low precision
        self.lost = 0  # of those, entries the rounding dropped
        self.norm_sq = 0.0  # squared norm of those deltas
        self.lost_norm_sq = 0.0  # squared norm of the dropped entries

    def add(self, weight: torch.Tensor, delta: torch.Tensor, merged: torch.Tensor) -> None:
        """Count one merge: ``weight`` the base (``(out, in)``, the merge's dtype), ``delta`` the
        summed ``scale * B @ A`` (higher precision), ``merged`` = ``(weight + delta)`` rounded to
        ``weight.dtype``. Nothing counted for dtypes outside :attr:`LOW_PRECISION`."""
        if merged.dtype not in self.LOW_PRECISION:
            return
        self.dtype = merged.dtype
        nonzero = delta != 0
        lost = (merged == weight) & nonzero
        d2 = delta.double().square()
        self.entries += int(nonzero.sum())
        self.lost += int(lost.sum())
        self.norm_sq += float(d2.sum())
        self.lost_norm_sq += float(d2[lost].sum())

    @property
    def lost_fraction(self) -> float:
        """The share of non-zero delta entries the rounding dropped (0 before any)."""
        return self.lost / self.entries if self.entries else 0.0

    @property
    def lost_norm_fraction(self) -> float:
        """The share of the deltas' norm (``sqrt`` of the squared-norm share) the rounding dropped."""
        return (self.lost_norm_sq / self.norm_sq) ** 0.5 if self.norm_sq else 0.0

    def warn_once(self) -> bool:
        """Log the warning if entries were lost and it was not logged yet; True when it was logged now."""
        if self.warned or not self.lost:
            return False
        self.warned = True
        logger.warning(
            "%s: LoRA merged into %s base weights loses small updates: %.1f %% of the %d non-zero delta entries "
            "(%.1f %% of the delta norm) round back to the base weight (|delta| below half of %s's spacing, "
            "2^-8 |W| for bfloat16), so the sampler runs a policy closer to the base than the one trained "
            "(docs/gpu.md, 'vLLM'); float32 weights keep them", self.where, str(self.dtype).removeprefix("torch."),
            100 * self.lost_fraction, self.entries, 100 * self.lost_norm_fraction,
            str(self.dtype).removeprefix("torch."))
        return True


def is_bnb_layer(module: torch.nn.Module) -> bool:
    """A bitsandbytes 4-/8-bit layer (its weight is packed, not a float matrix)."""
    weight = getattr(module, "weight", None)
    return weight is not None and type(weight).__name__ in ("Params4bit", "Int8Params")


def dense_base_weight(layer: torch.nn.Module) -> torch.Tensor:
    """The float weight of a linear layer (dequantized for bitsandbytes layers)."""
    if is_bnb_layer(layer):
        from peft.utils.integrations import dequantize_module_weight

        return dequantize_module_weight(layer).detach()
    return layer.weight.detach()


def _unmerged_active(module) -> list[str]:
    """The active adapters of a peft LoRA layer that are not merged into its base weight already."""
    if getattr(module, "disable_adapters", False):
        return []
    merged = set(getattr(module, "merged_adapters", []))
    return [name for name in module.active_adapters if name not in merged and
            (name in getattr(module, "lora_A", {}) or name in getattr(module, "lora_embedding_A", {}))]


def lora_merged_weight(module, rounding: MergeRounding | None = None) -> torch.Tensor:
    """``W + sum_a delta_a`` of a peft LoRA layer over its active, unmerged adapters (nothing mutated).

    Args:
        rounding: where given, the merge is counted in it (:meth:`MergeRounding.add`).

    Returns:
        ``(out_features, in_features)`` in the base weight's dtype (bitsandbytes layers dequantized).

    Raises:
        ValueError: an active adapter uses DoRA (its merged weight is not ``W + scale * B @ A``).
    """
    weight = dense_base_weight(module.get_base_layer())
    delta = None
    for name in _unmerged_active(module):
        if getattr(module, "use_dora", {}).get(name, False):
            raise ValueError(f"the LoRA adapter {name!r} uses DoRA, whose merged weights gtpo does not compute")
        d = module.get_delta_weight(name).detach()
        delta = d if delta is None else delta + d
    if delta is None:
        return weight
    merged = (weight.to(delta.dtype) + delta).to(weight.dtype)
    if rounding is not None:
        rounding.add(weight, delta, merged)
    return merged


def _mergeable(module, dtypes) -> bool:
    """Whether ``module`` is a peft LoRA linear layer over a plain, local, unsharded ``nn.Linear``
    with a weight in ``dtypes``, whose active adapters are plain LoRA (no DoRA, no LoRA bias)."""
    from peft.tuners.lora import Linear as LoraLinear

    if type(module) is not LoraLinear or getattr(module, "fan_in_fan_out", False):
        return False
    base = module.get_base_layer()
    weight = getattr(base, "weight", None)
    if (type(base) is not torch.nn.Linear or type(weight) is not torch.nn.Parameter or weight.dtype not in dtypes
            or weight.device.type == "meta" or tuple(weight.shape) != (base.out_features, base.in_features)
            or hasattr(weight, "ds_id") or hasattr(base, "_hf_hook") or hasattr(module, "_hf_hook")):
        return False  # quantized, offloaded (accelerate hooks), DeepSpeed/FSDP-sharded or otherwise special
    names = _unmerged_active(module)
    return bool(names) and all(
        not getattr(module, "use_dora", {}).get(n, False) and n in module.lora_A
        and getattr(module.lora_B[n], "bias", None) is None for n in names)


def mergeable_lora_layers(model: torch.nn.Module, dtypes=MERGE_DTYPES) -> list[str]:
    """Names (as ``model.named_modules()`` gives them) of the LoRA layers :func:`merged_lora_layers`
    would merge; empty when peft is not installed or the model has none."""
    try:
        import peft  # noqa: F401
    except ImportError:
        return []
    return [name for name, module in model.named_modules() if _mergeable(module, dtypes)]


def _merged_linear(module) -> torch.nn.Linear:
    """A plain ``nn.Linear`` computing what the LoRA layer ``module`` computes in eval mode, its
    weight ``W + sum scale_a * B_a @ A_a`` (one ``addmm`` per adapter), its bias the base's own."""
    base = module.get_base_layer()
    weight = None
    with torch.no_grad():
        for name in _unmerged_active(module):
            b, a = module.lora_B[name].weight, module.lora_A[name].weight  # (out, r), (r, in)
            scale = float(module.scaling[name])
            b, a = b.to(base.weight.dtype), a.to(base.weight.dtype)
            weight = torch.addmm(base.weight, b, a, alpha=scale) if weight is None else weight.addmm_(b, a, alpha=scale)
    linear = torch.nn.Linear(base.in_features, base.out_features, bias=False, device="meta")
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    linear.bias = base.bias
    linear.train(module.training)
    return linear


@contextlib.contextmanager
def merged_lora_layers(model: torch.nn.Module, dtypes=MERGE_DTYPES) -> Iterator[int]:
    """Within the block, every LoRA layer of :func:`mergeable_lora_layers` is replaced in ``model``
    by a plain ``nn.Linear`` with its merged weight; the original layers are put back after (also
    on an exception), unchanged. For inference only: the merged weights take no gradient.

    Yields:
        The number of layers replaced (0: the model is left as it is).
    """
    names = mergeable_lora_layers(model, dtypes)
    swapped = []
    try:
        for name in names:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            original = getattr(parent, child)
            setattr(parent, child, _merged_linear(original))
            swapped.append((parent, child, original))
        yield len(swapped)
    finally:
        for parent, child, original in reversed(swapped):
            setattr(parent, child, original)
