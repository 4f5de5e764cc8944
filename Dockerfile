# One image for every FAST service; the command picks the role (fast sim-server, ...).
FROM python:3.11-slim

# torch is installed first and by exact version. For a CPU-only image pass the CPU wheel
# index in TORCH_PIP_ARGS (e.g. --index-url <your CPU wheel index>); by default pip takes
# the CUDA build, which the learner uses when the node has a GPU.
ARG TORCH_PIP_ARGS=""
RUN pip install --no-cache-dir ${TORCH_PIP_ARGS} torch==2.13.0

WORKDIR /app
COPY pyproject.toml README.md ./
COPY fast ./fast
COPY sim_server ./sim_server
COPY learner ./learner
COPY broker ./broker
COPY gateway ./gateway
COPY jobs ./jobs
RUN pip install --no-cache-dir .

# /data holds the learner's checkpoints and the broker's metrics; owned by the service user so
# that a fresh named volume mounted there is writable.
RUN useradd --create-home --uid 10001 fast && mkdir -p /data/checkpoints /data/run && chown -R fast /data
USER fast
EXPOSE 50051 50052 50053 8080
ENTRYPOINT ["fast"]
CMD ["sim-server", "--host", "0.0.0.0", "--port", "50051"]
