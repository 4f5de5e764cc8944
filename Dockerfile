# One image for every FAST service; the command picks the role (fast sim-server, ...).
#
#   docker build -t fast:latest .                   # public base, torch's CPU wheel from its index
#   docker compose up --build --scale sim-server=3  # builds it the same way
#
# Without an image registry (no python:3.11-slim to pull), build on a base made from Debian's
# packages and take torch's wheel from the build context: deploy/local-base.sh and
# deploy/compose.local.yml. A CUDA learner image: docs/deploy.md (documented, not built here).

# The base: a Debian-like image with python3 3.11 and its venv module.
ARG BASE_IMAGE=python:3.11-slim

# -- wheel: the project itself, as a small wheel (the image keeps no copy of its sources) ----------
FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fast ./fast
COPY sim_server ./sim_server
COPY learner ./learner
COPY broker ./broker
COPY gateway ./gateway
COPY jobs ./jobs
RUN python3 -m venv /tmp/build-venv \
    && /tmp/build-venv/bin/pip wheel --no-cache-dir --disable-pip-version-check --no-deps --wheel-dir /dist .

# -- the image ---------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
# /data holds the learner's checkpoints and the broker's metrics; owned by the service user so
# that a fresh named volume mounted there is writable.
RUN useradd --create-home --uid 10001 fast && mkdir -p /data/checkpoints /data/run && chown -R fast /data

# torch first and by exact version, as dev.py installs it, and never a CUDA build by default: from
# its CPU wheel index (torch's own dependencies lie there too). With TORCH_PIP_ARGS="" pip takes the
# wheel from deploy/wheels/ in the build context (it prefers 2.13.0+cpu there to PyPI's 2.13.0),
# and refuses to start without one there. A CUDA build: a CUDA wheel index here (docs/deploy.md).
# torch's C++ headers and C++ test programs (about 145 MB) serve no service: removed in this layer.
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
RUN --mount=type=bind,source=deploy/wheels,target=/tmp/wheels \
    if [ -z "${TORCH_PIP_ARGS}" ] && ! ls /tmp/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then \
        echo "TORCH_PIP_ARGS is empty and deploy/wheels/ holds no torch 2.13.0+cpu wheel: pip would take a CUDA build" >&2; \
        exit 1; \
    fi \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --find-links /tmp/wheels ${TORCH_PIP_ARGS} torch==2.13.0 \
    && rm -rf /opt/venv/lib/python3.11/site-packages/torch/include /opt/venv/lib/python3.11/site-packages/torch/test \
    && /opt/venv/bin/python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# The project's other dependencies, read from pyproject.toml (torch==2.13.0 is satisfied already);
# this layer is rebuilt only when pyproject.toml changes.
COPY pyproject.toml /tmp/pyproject.toml
RUN /opt/venv/bin/python -c "import tomllib; print(*tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" > /tmp/requirements.txt \
    && /opt/venv/bin/pip install -r /tmp/requirements.txt \
    && rm /tmp/pyproject.toml /tmp/requirements.txt

COPY --from=wheel /dist/ /tmp/dist/
RUN /opt/venv/bin/pip install --no-deps /tmp/dist/*.whl && rm -rf /tmp/dist

ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
USER fast
WORKDIR /home/fast
EXPOSE 50051 50052 50053 8080
# Each service's health check is in docker-compose.yml and deploy/k8s (its own port and protocol):
# `python -m fast.health 127.0.0.1:PORT` for the gRPC services, the same with http://.../healthz for the gateway.
ENTRYPOINT ["fast"]
CMD ["sim-server", "--host", "0.0.0.0", "--port", "50051"]
