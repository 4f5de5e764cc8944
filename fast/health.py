"""One health check of a FAST service: the standard gRPC health service, or GET on an http(s) URL.

Its own module, importing only grpc (and, with TLS, fast.tls), because container health checks
run it every few seconds beside the services they check: `python -m fast.health 127.0.0.1:50051`
starts in a fifth of a second, where the whole `fast` command (jobs/cli.py, every service's
settings) takes about a second on an idle machine and several on a loaded one, long enough to
miss a health check's deadline and have a healthy container declared unhealthy. `fast health`
is the same check with the same arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional


def check(
    address: str,
    timeout_s: float = 3.0,
    tls_ca: Optional[Path] = None,
    tls_cert: Optional[Path] = None,
    tls_key: Optional[Path] = None,
    tls_server_name: Optional[str] = None,
) -> tuple[bool, str]:
    """(healthy, the line to print). Raises ValueError for unusable TLS options."""
    if address.startswith(("http://", "https://")):
        return _http(address, timeout_s, tls_ca)
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if tls_ca or tls_cert or tls_key:
        from fast.tls import TlsFiles, channel_credentials, channel_options

        tls = TlsFiles(tls_cert, tls_key, tls_ca, tls_server_name)
        channel = grpc.secure_channel(address, channel_credentials(tls), options=channel_options(tls))
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            return False, f"{address}: {exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def _http(url: str, timeout_s: float, tls_ca: Optional[Path]) -> tuple[bool, str]:
    """GET the URL; healthy on a 2xx answer. One plain argument, so that a container health check
    needs no shell and no quoting (podman's Docker API splits a health check's arguments at spaces:
    `python -c "import ..."` reaches the container as `python -c import`)."""
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=str(tls_ca) if tls_ca else None) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as reply:
            code = reply.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except (urllib.error.URLError, OSError) as exc:
        return False, f"{url}: {getattr(exc, 'reason', exc)}"
    return 200 <= code < 300, f"{url}: {code}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fast.health", description="Exit 0 when the service is healthy.")
    parser.add_argument("address", help="HOST:PORT of a gRPC service, or the gateway's http(s)://HOST:PORT/healthz")
    parser.add_argument("--timeout-s", type=float, default=3.0)
    parser.add_argument("--tls-ca", type=Path)
    parser.add_argument("--tls-cert", type=Path)
    parser.add_argument("--tls-key", type=Path)
    parser.add_argument("--tls-server-name")
    args = parser.parse_args(argv)
    try:
        healthy, line = check(
            args.address, args.timeout_s, args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(line, file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
