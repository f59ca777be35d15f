#!/usr/bin/env bash
# `npm run setup:python`: the Python environment the tests, examples and benchmarks use, in .venv
# at the checkout's root (or $MONKEYTREE_VENV): torch for CPU, and the hook's lint and test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${MONKEYTREE_VENV:-.venv}"
# Replacements run as the tenant's user (a daemon's --run-as), who must be able to run this
# environment's interpreter: a venv links to its base, so the base is the system's python3 where
# there is one, not one under a user's home (pyenv's lives in /root, closed to others).
base="${MONKEYTREE_BASE_PYTHON:-}"
if [ -z "$base" ]; then
  if [ -x /usr/bin/python3 ]; then base=/usr/bin/python3; else base="$(command -v python3)"; fi
fi
home="$(dirname "$(readlink -f "$base")")"
if [ -f "$venv/pyvenv.cfg" ] && ! grep -qx "home = $home" "$venv/pyvenv.cfg"; then
  echo "setup:python: $venv was made from another interpreter; making it again from $base"
  rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "setup:python: creating $venv with $("$base" --version) ($base)"
  "$base" -m venv "$venv"
fi
echo "setup:python: installing sdk/python/requirements-dev.txt into $venv (torch alone is about 700 MB)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r sdk/python/requirements-dev.txt
"$venv/bin/python" -c 'import torch; print(f"setup:python: torch {torch.__version__} ready in '"$venv"'")'
