"""No silent mixes (issue 30, item 3): a baseline loss with one of GTPO's switches on is refused, naming the
fields, unless ``gtpo_ablation: true`` says the ablation is meant; the README's GTPO-vs-GRPO recipe trains pure
GRPO."""

import json
import os

import pytest
import yaml

from gtpo import GTPOConfig
from gtpo.cli import main


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("switch, value", [("gamma", 0.1), ("entropy_filter", True), ("conflict_masks", True),
                                           ("completion_sign", "positive")])
def test_a_baseline_with_a_gtpo_switch_is_refused_naming_it(loss_type, switch, value):
    with pytest.raises(ValueError, match=rf"GTPOConfig.loss_type='{loss_type}' is a baseline, but GTPO's "
                                         rf"{switch}={value!r} would change it .* set gtpo_ablation: true"):
        GTPOConfig(loss_type=loss_type, **{switch: value})
    ablation = GTPOConfig(loss_type=loss_type, gtpo_ablation=True, **{switch: value})
    assert ablation.gtpo_switches_on() == [f"{switch}={value!r}"]


def test_switches_stated_off_and_gtpo_itself_are_accepted():
    GTPOConfig(loss_type="grpo", gamma=0.0, entropy_filter=False, conflict_masks=False, completion_sign="all")
    GTPOConfig(loss_type="grpo", entropy_threshold=0.5, entropy_rule="initial", pos_weight=3.0)  # inert without the switch
    assert GTPOConfig(loss_type="gtpo", gamma=0.3, conflict_masks=True).gtpo_switches_on() == []
    with pytest.raises(ValueError, match=r"entropy_filter=True, gamma=0.1"):  # every one named
        GTPOConfig(loss_type="grpo", gamma=0.1, entropy_filter=True)


def test_the_demo_yaml_rerun_as_grpo_is_refused_then_the_readme_recipe_is_pure_grpo(tiny_model_path, tmp_path,
                                                                                      capsys):
    # `gtpo train --demo --print_config > my.yaml` (the demo's model and data swapped for tiny local ones)
    assert main(["train", "--demo", "--print_config"]) == 0
    spec = yaml.safe_load(capsys.readouterr().out)
    assert spec["gamma"] == 0.1 and spec["loss_type"] == "gtpo"
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(8)))
    spec.update(model=tiny_model_path, dataset={"name": str(data), "template": "plain"}, eval_dataset=None,
                eval_before_after=False, peft={"r": 4}, group_size=4, prompts_per_step=2, max_steps=2,
                max_completion_length=6, save_steps=0, dtype=None)
    my = tmp_path / "my.yaml"
    my.write_text(yaml.safe_dump(spec))
    # the mix the issue found: GRPO with GTPO's -gamma*H shift, now refused, naming the field and the way out
    assert main(["train", str(my), "--loss_type", "grpo", "--output_dir", str(tmp_path / "mixed")]) == 2
    err = capsys.readouterr().err
    assert "--loss_type: GTPOConfig.loss_type='grpo' is a baseline, but GTPO's gamma=0.1 would change it" in err
    assert not os.path.exists(tmp_path / "mixed" / "metrics.jsonl")
    # the README's recipe
    out = tmp_path / "grpo"
    assert main(["train", str(my), "--loss_type", "grpo", "--gamma", "0", "--output_dir", str(out)]) == 0
    lines = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert len(lines) == 2 and all(m.get("gtpo/adv_shift_mean", 0.0) == 0.0 for m in lines)  # no -gamma*H shift
    assert all(m.get("gtpo/filtered_frac", 0.0) == 0.0 and m.get("gtpo/weighted_token_frac", 0.0) == 0.0
               for m in lines)  # no filter, no conflict weights
    config = GTPOConfig.from_dict({k: v for k, v in json.loads((out / "run_config.json").read_text()).items()
                                   if k in GTPOConfig.field_names()})
    assert config.loss_type == "grpo" and config.resolved_gamma == 0.0 and not config.resolved_entropy_filter
    assert not config.resolved_conflict_masks and config.completion_sign == "all" and not config.gtpo_ablation
