#!/usr/bin/env bash
# The project's run command: three tenants share a local Kubernetes control
# plane and kube-arbiter; watch their shares converge.
#
# Sets up .venv (scripts/setup-venv.sh), then `arbiter demo`: builds the
# sandbox on first use (cached in ~/.cache/kube-arbiter/), starts it in
# .sandbox with arbiter wired in, runs the demo (about 90 s; --duration
# changes it, --help lists the rest) and leaves the sandbox running.
# Stop it with `.venv/bin/arbiter sandbox down`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
exec .venv/bin/python -m arbiter demo "$@"
