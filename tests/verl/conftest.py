"""tests/verl run in the verl venv (bash scripts/test-verl.sh): verl pins its own transformers. Elsewhere (gtpo's main
venv, no verl installed) the folder is not collected. (The check reads the installed distribution: an import would
find this folder, named verl, as a namespace package.)"""

from importlib import metadata

try:
    metadata.version("verl")
    collect_ignore_glob: list[str] = []
except metadata.PackageNotFoundError:
    collect_ignore_glob = ["*.py"]
