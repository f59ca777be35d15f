"""``python -m monkeytree.torchrun ARGS``: torchrun, with the shims torch 1.13 needs on Python 3.11.

Debian's torch 1.13 ships a ``torchrun`` that fails before starting a worker on Python 3.11
(see compat.py); this entry point applies the shim first and then runs torch's own launcher
with the same arguments, so ``monkeytree launch -- python3 -m monkeytree.torchrun ...`` works
wherever ``torchrun`` would on newer torch.
"""
import sys

from . import compat

compat.patch_torchrun_std()

from torch.distributed.run import main  # noqa: E402  (the shim must come first)

if __name__ == "__main__":
    main(sys.argv[1:])
