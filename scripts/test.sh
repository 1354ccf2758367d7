#!/usr/bin/env bash
# The project's test command: sets up everything a fresh machine needs, then
# runs the linters and the whole test suite (unit + e2e on the real control
# plane). Extra arguments go to pytest, e.g. `scripts/test.sh -m "not e2e"`.
# Tests run in ARBITER_TEST_WORKERS processes (default 2; 0 = one process),
# a test file per worker at a time: each worker that reaches an e2e file starts
# a sandbox of its own (free ports, its own directory), and e2e tests mostly
# wait on the apiserver, so two sandboxes share the two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
# Build (or reuse from ~/.cache/kube-arbiter) etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok and the JobSet and
# LeaderWorkerSet controllers.
.venv/bin/arbiter sandbox build
# Debian's chromium and chromium-driver for the web view's browser test.
scripts/setup-browser.sh >/dev/null
.venv/bin/ruff check .
.venv/bin/mypy
workers="${ARBITER_TEST_WORKERS:-2}"
parallel=()
if [ "$workers" != "0" ]; then
  parallel=(-n "$workers" --dist loadfile)
fi
exec .venv/bin/pytest "${parallel[@]}" "$@"
