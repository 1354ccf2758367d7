# kube-arbiter's image: `arbiter serve` on a slim Python, non-root.
#
#   docker build -t REGISTRY/kube-arbiter:TAG .
#
# Two stages: the first builds the wheel and a virtualenv with the runtime
# dependencies only (scripts/install-runtime.sh, the same script
# tests/deploy/test_image_install.py runs, so the two cannot drift); the
# second copies that virtualenv onto the same base image. No compiler, no
# pip and no source tree in the final image.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY arbiter/ arbiter/
COPY webhook/ webhook/
COPY extender/ extender/
COPY certs/ certs/
COPY scripts/install-runtime.sh scripts/
RUN python -m pip wheel --no-deps --wheel-dir /dist .
RUN scripts/install-runtime.sh /opt/arbiter /dist/kube_arbiter-*.whl

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/arbiter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/arbiter /opt/arbiter
# 65532: the conventional "nonroot" uid/gid; no home, no shell needed. The
# Deployment also sets runAsNonRoot and a read-only root filesystem: the
# certificate directory is a volume there.
USER 65532:65532
# HTTPS: webhooks, scheduler extender, /metrics, /healthz (liveness),
# /readyz (readiness: the cache has synced).
EXPOSE 9443 9444 9445
# For `docker run` (Kubernetes uses the Deployment's probes instead): the
# event loop answers /healthz. The certificate is arbiter's own, so not
# verified here.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
  CMD ["python", "-c", "import os, ssl, urllib.request; urllib.request.urlopen('https://127.0.0.1:' + os.environ.get('ARBITER_PORT', '9443') + '/healthz', context=ssl._create_unverified_context(), timeout=3)"]
ENTRYPOINT ["arbiter", "serve"]
