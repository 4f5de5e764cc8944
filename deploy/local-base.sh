#!/usr/bin/env bash
# A base image for the Dockerfile made from Debian's packages, for machines that reach Debian's
# mirror but no image registry (python:3.11-slim cannot be pulled there):
#
#   bash deploy/local-base.sh                 # makes and tags localhost/fast-base:bookworm
#   podman build --build-arg BASE_IMAGE=localhost/fast-base:bookworm ...
#
# Debian bookworm's python3 is 3.11, as in python:3.11-slim; python3-venv brings ensurepip (the
# image's build stage makes its venv with it); ca-certificates lets pip reach PyPI over TLS.
# Root, debootstrap and podman are needed (deploy/ci-containers.sh installs them).
# The CA certificates this machine added to its own store (/usr/local/share/ca-certificates, for
# example a TLS-intercepting proxy's) are added to the base too, so that pip in the build reaches
# PyPI the way the host does; none on an ordinary machine.
# Variables: FAST_BASE_IMAGE (the tag), DEBIAN_MIRROR (default: the mirror apt uses here),
# EXTRA_CA_DIR (default /usr/local/share/ca-certificates; empty for none).
set -euo pipefail

TAG=${FAST_BASE_IMAGE:-localhost/fast-base:bookworm}
ENGINE=${ENGINE:-podman}

if [[ -z "${DEBIAN_MIRROR:-}" ]]; then
    # The first Debian URI in apt's sources (deb822 "URIs:" or one-line "deb URI bookworm ...").
    DEBIAN_MIRROR=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
        | awk '/^URIs:/ && $2 ~ /debian\/?$/ {print $2; exit} /^deb / && $3 ~ /^bookworm$/ {print $2; exit}' || true)
    DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
fi

ROOTFS=$(mktemp -d /var/tmp/fast-base.XXXXXX)
trap 'rm -rf "$ROOTFS" "$ROOTFS.log"' EXIT
started=$SECONDS
echo "+ debootstrap minbase bookworm from $DEBIAN_MIRROR"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$ROOTFS" "$DEBIAN_MIRROR" >"$ROOTFS.log" 2>&1 || { tail -30 "$ROOTFS.log"; exit 1; }
rm -f "$ROOTFS.log"
EXTRA_CA_DIR=${EXTRA_CA_DIR-/usr/local/share/ca-certificates}
if [[ -n "$EXTRA_CA_DIR" ]] && compgen -G "$EXTRA_CA_DIR/*.crt" >/dev/null; then
    cp "$EXTRA_CA_DIR"/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
    chroot "$ROOTFS" update-ca-certificates >/dev/null
    echo "+ added this machine's CA certificates: $(cd "$EXTRA_CA_DIR" && echo *.crt)"
fi
# What an image needs no copy of: apt's lists and caches, documentation, locales but C.UTF-8.
chroot "$ROOTFS" apt-get clean
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* \
    "$ROOTFS"/usr/share/info/* "$ROOTFS"/var/cache/debconf/*-old "$ROOTFS"/var/log/*.log
find "$ROOTFS"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'C.UTF-8' -exec rm -rf {} + 2>/dev/null || true
chroot "$ROOTFS" python3 --version

tar -C "$ROOTFS" -c . | "$ENGINE" import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    - "$TAG" >/dev/null
echo "tagged $TAG in $((SECONDS - started)) s: $("$ENGINE" image ls --format '{{.Size}}' "$TAG")"
