#!/usr/bin/env bash
# Prepares this machine for the container test (tests/test_deploy_containers.py), which builds the
# image and runs docker-compose.yml in real containers through podman (docs/deploy.md):
#   - Debian's podman, runc and debootstrap (apt-get, as root);
#   - /etc/containers/containers.conf from deploy/podman/containers.conf, if there is none yet
#     (runc with cgroupfs, the host's ulimits, logs in files: what works on these machines);
#   - the base image from Debian's packages (deploy/local-base.sh), once per machine;
#   - torch's CPU wheel in deploy/wheels/, taken where pip finds it on this machine (its
#     find-links: the same wheel dev.py installs), never downloaded.
# The image itself is built by the test, as `docker compose up --build` builds it.
#
# Exit 0: ready. Exit 75: podman cannot run containers on this machine (not root, no apt-get, or a
# container does not start); the reason is printed and the test will skip. Anything else: a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
cannot() { echo "ci-containers: cannot run containers here: $*" >&2; exit 75; }
started=$SECONDS

[[ $(id -u) == 0 ]] || cannot "not root"
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
    command -v apt-get >/dev/null || cannot "no podman, and no apt-get to install it"
    echo "+ apt-get install podman runc debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
fi
if [[ ! -e /etc/containers/containers.conf ]]; then
    install -D -m 644 deploy/podman/containers.conf /etc/containers/containers.conf
    echo "+ /etc/containers/containers.conf from deploy/podman/containers.conf"
fi

if ! podman image exists localhost/fast-base:bookworm; then
    base_started=$SECONDS
    bash deploy/local-base.sh
    echo "ci-containers: base image made in $((SECONDS - base_started)) s"
fi
probe=$(podman run --rm --network none localhost/fast-base:bookworm python3 -c 'print("ok")' 2>&1) \
    || cannot "a container does not start: $probe"

if ! compgen -G "deploy/wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
    # --no-index: only the wheels pip's configuration points at on this machine, no download.
    python3 -m pip download -q --no-index --no-deps --only-binary :all: torch==2.13.0 -d deploy/wheels
    compgen -G "deploy/wheels/torch-2.13.0+cpu-*.whl" >/dev/null \
        || { echo "ci-containers: pip found no torch 2.13.0+cpu wheel on this machine" >&2; exit 1; }
fi
echo "ci-containers: podman $(podman --version | awk '{print $3}'), base image and torch wheel ready in $((SECONDS - started)) s"
