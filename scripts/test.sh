#!/usr/bin/env bash
# The project's test command: sets up everything a fresh machine needs, then
# runs the linters and the whole test suite (unit + e2e on the real control
# plane). Extra arguments go to pytest, e.g. `scripts/test.sh -m "not e2e"`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
# Build (or reuse from ~/.cache/kube-arbiter) etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl and kwok.
.venv/bin/arbiter sandbox build
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/pytest "$@"
