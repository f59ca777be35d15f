#!/usr/bin/env bash
# `npm run setup:python`: the Python environment the tests, examples and benchmarks use, in .venv
# at the checkout's root (or $MONKEYTREE_VENV): torch for CPU, and the hook's lint and test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${MONKEYTREE_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup:python: creating $venv with $(python3 --version)"
  python3 -m venv "$venv"
fi
echo "setup:python: installing sdk/python/requirements-dev.txt into $venv (torch alone is about 700 MB)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r sdk/python/requirements-dev.txt
"$venv/bin/python" -c 'import torch; print(f"setup:python: {torch.__version__} ready in '"$venv"'")'
