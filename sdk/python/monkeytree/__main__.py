"""``python3 -m monkeytree --version``: which hook a training environment has installed."""
from __future__ import annotations

import sys

from ._version import __version__

HELP = f"""usage: python3 -m monkeytree (--version | --help)
       python3 -m monkeytree export --help

MonkeyTree's hook for training scripts, version {__version__}. A script imports it, calls
monkeytree.attach() once and job.barrier(step, state_fn) every iteration, and runs under
`monkeytree launch` (the npm package of the same version), which hands its processes the
local channel ($MONKEYTREE_CHANNEL) and the addon's CRC32C library ($MONKEYTREE_CRC32C_LIB).
Without the launcher the script runs as a plain torchrun job.

`python3 -m monkeytree export` writes staged checkpoints as a standard DCP checkpoint directory.

options:
  --version    print the version
  -h, --help   show this help

exit codes: 0 ok, 2 bad usage.
"""


def main(argv: list[str]) -> int:
    if argv[:1] == ["export"]:
        # Imported here: it needs torch, which --version and --help do without.
        from .export import main as export_main
        return export_main(argv[1:])
    if argv == ["--version"]:
        print(f"monkeytree {__version__}")
        return 0
    if argv in (["-h"], ["--help"]):
        print(HELP, end="")
        return 0
    given = " ".join(argv) if argv else "no arguments"
    print(f"python3 -m monkeytree: expected --version or --help, got {given}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
