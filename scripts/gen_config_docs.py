"""Write docs/config.md from GTPOConfig's field documentation (run after changing gtpo/config/).

    python scripts/gen_config_docs.py          # rewrite docs/config.md
    python scripts/gen_config_docs.py --check  # exit 1 if docs/config.md is out of date
"""

import dataclasses
import os
import sys

from gtpo.app import RunSpec
from gtpo.config import GTPOConfig

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "config.md")


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `gtpo/config/` and `gtpo/app/spec.py` by `python scripts/gen_config_docs.py`; `gtpo train --help` prints the same.",
        "Tags: [P] the GTPO paper (arXiv 2508.03772), [C] its released reference code, [D] a decision of this project.",
        "",
        "## Run keys (YAML top level, `gtpo train` only)",
        "",
        "| key | meaning |",
        "|---|---|",
    ]
    lines += [f"| `{k}` | {v} |" for k, v in RunSpec.key_help().items()]
    lines += ["", "## Trainer fields (`GTPOConfig`)", "", "| field | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(GTPOConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        doc = f.metadata.get("help", "").replace("|", "\\|")
        lines.append(f"| `{f.name}` | `{default!r}` | {doc} |")
    lines += ["", "## Presets (`--preset NAME` or `GTPOConfig.from_preset(NAME)`)", ""]
    for name in GTPOConfig.PRESETS:
        values = ", ".join(f"`{k}={v!r}`" for k, v in GTPOConfig.preset_values(name).items())
        lines.append(f"- **{name}**: {values}")
    lines += ["", "Presets set the method's fields, never the optimiser. The released code's optimiser (Adam "
              "β1 = β2 = 0.999999, `weight_decay` 0.1, `max_grad_norm` 0.1, cosine schedule with `warmup_ratio` "
              "0.005, `optim: paged_adamw_8bit`) is in the paper configs, `configs/paper/*.yaml`; on the stress model "
              "GTPO and GRPO collapsed alike under either optimiser ([results](results.md), claim 2)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        current = open(PATH).read() if os.path.exists(PATH) else ""
        sys.exit(0 if current == text else 1)
    with open(PATH, "w") as fh:
        fh.write(text)
    print(f"wrote {PATH}")
