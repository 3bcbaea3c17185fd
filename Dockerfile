# One image for every entry point of hami-py:
#   hami scheduler            the scheduler extender (beside a stock kube-scheduler)
#   hami-webhook              the mutating admission webhook (Kopf)
#   hami-monitor              the node agent (device plugin, registration, metrics)
#   python -m webhook.certs   the chart's certificate job
#   hami demo                 the whole system on an embedded API server, for trying it out
# The chart sets the command of each container; the image has no ENTRYPOINT of its own.
#
#   docker build -t hami-py:0.1.0 .

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: turn the project into a wheel (no compiler needed: every dependency ships wheels)
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY hami ./hami
COPY webhook ./webhook
COPY monitor ./monitor
# hami/sim/annotation-policy.yaml links here: the demo's embedded cluster enforces the chart's policy
COPY charts/hami/files/annotation-policy.yaml ./charts/hami/files/
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[demo]"

# --- runtime: the wheels installed, nothing else
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels "hami-py[demo]" \
 && hami --help >/dev/null \
 && hami-webhook --help >/dev/null \
 && hami-monitor --help >/dev/null
# Non-root by default (scheduler, webhook, certificate job); the node agent's pod runs as root because
# it creates its socket in the kubelet's root-owned device-plugin directory.
USER 65532:65532
WORKDIR /tmp
CMD ["hami", "--help"]
