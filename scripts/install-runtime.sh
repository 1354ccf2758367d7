#!/bin/sh
# install-runtime.sh VENV WHEEL: a fresh virtualenv at VENV holding the
# kube-arbiter wheel and its runtime dependencies only (no test or dev
# extras). The Dockerfile runs exactly this, and tests/deploy runs it too,
# so the image and the test cannot drift apart.
set -eu
if [ "$#" -ne 2 ]; then
  echo "usage: $0 VENV WHEEL" >&2
  exit 2
fi
venv=$1
wheel=$2
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel"
# pip is not needed at run time; setuptools never was.
"$venv/bin/python" -m pip uninstall --quiet --yes pip setuptools 2>/dev/null || true
# The entry point must work from the venv as the image runs it.
"$venv/bin/arbiter" serve --help >/dev/null
