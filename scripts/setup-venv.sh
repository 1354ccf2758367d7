#!/usr/bin/env bash
# Create .venv (if needed) and install kube-arbiter with its test and dev extras.
# Re-running is cheap: pip is only called when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test,dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
