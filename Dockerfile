# Two images from one build, both with every entry point of hami-py on PATH:
#
#   docker build -t REGISTRY/hami-py:0.1.0 .                  the product (the last stage, the default):
#       hami scheduler            the scheduler extender (beside a stock kube-scheduler)
#       hami-webhook              the mutating admission webhook (Kopf)
#       hami-node-agent           the node agent (device plugin, registration, metrics)
#       python -m webhook.certs   the chart's certificate job
#       hami explain|cordon|uncordon|doctor, and `hami simulate|heldout|demo --help` (running them needs the
#       'sim' or the 'demo' extra)
#     installed without extras: no embedded cluster, no simulator (no kmock, CEL, OpenAPI schemas, numpy).
#   docker build --target demo -t hami-py-demo:0.1.0 .         the same plus the 'demo' extra:
#       docker run --rm hami-py-demo:0.1.0                     `hami demo`, the whole system on an embedded
#                                                              cluster (add `--keep` and -it to stay)
# The chart sets the command of each container; the product image has no ENTRYPOINT of its own.
# `make lint` runs hadolint on this file; .ci/run builds both targets where a container engine exists.

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: the product and the test kit as wheels, and wheels of their dependencies (the demo extra
# is the test kit; no compiler needed: every dependency ships wheels)
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY hami ./hami
COPY webhook ./webhook
COPY nodeagent ./nodeagent
COPY testkit ./testkit
# testkit/hami_testkit/annotation-policy.yaml links here: the demo's embedded cluster enforces the
# chart's policy
COPY charts/hami/files/annotation-policy.yaml ./charts/hami/files/
RUN pip wheel --no-cache-dir --wheel-dir /wheels ./testkit ".[demo]"

# --- what both images share: Python's settings for a container
FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /tmp

# --- demo: the embedded cluster and the example pods (`hami demo`)
FROM runtime AS demo
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# the version of the wheel built above (hami_py-VERSION-py3-none-any.whl), pinned with its extra
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    wheel=(/wheels/hami_py-*.whl) && version="${wheel[0]#/wheels/hami_py-}" \
 && pip install --no-cache-dir --no-index --find-links=/wheels "hami-py[demo]==${version%%-*}" \
 && hami demo --help >/dev/null
USER 65532:65532
CMD ["hami", "demo"]

# --- product (the default target): what the chart's pods run, installed without extras
FROM runtime AS product
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/hami_py-*.whl \
 && for command in scheduler explain cordon uncordon doctor simulate heldout published demo; do \
        hami "$command" --help >/dev/null || exit 1; \
    done \
 && hami --help >/dev/null \
 && hami-webhook --help >/dev/null \
 && hami-node-agent --help >/dev/null \
 && python -m webhook.certs --help >/dev/null
# Non-root by default (scheduler, webhook, certificate job); the node agent's pod runs as root because
# it creates its socket in the kubelet's root-owned device-plugin directory.
USER 65532:65532
CMD ["hami", "--help"]
