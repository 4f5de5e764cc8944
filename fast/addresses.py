"""Simulator addresses as users write them: `HOST:PORT`, `[IPV6]:PORT`, or `dns:///NAME:PORT`
(one server per address the name resolves to).

Checked before dialling: gRPC takes almost any string as a target and only fails, later and as
UNAVAILABLE, to resolve it. The broker reads its `simulators` setting with `resolve_addresses`;
jobs check `--simulators` with the same rules (jobs/external.py).
"""

from __future__ import annotations

import ipaddress
import re
import socket

from fast.quoting import quote

# A host name of RFC 1123 labels (and underscores, which Docker's service names use), or an IPv4
# address; IPv6 comes in brackets and is checked apart.
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")


def split_host_port(address: str, *, form: str = "HOST:PORT") -> tuple[str, int]:
    """(host, port) of `HOST:PORT` or `[IPV6]:PORT` (the host without brackets); ValueError (quoting
    it, bounded) for anything else."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ok = ipaddress.ip_address(host).version == 6
        except ValueError:
            ok = False
    else:
        ok = len(host) <= 253 and _HOST_NAME.fullmatch(host) is not None
    if not (sep and ok and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"simulator address {quote(address)}: expected {form}, with a port in 1..65535")
    return host, int(port)


def resolve_addresses(spec: str) -> list[str]:
    """`host:port` as is; `dns:///name:port` (or `dns:name:port`) to one address per IP it resolves to.

    ValueError for an address of neither form; OSError when the name does not resolve.
    IPv4 answers are preferred: a dual-stack name such as localhost resolves to 127.0.0.1 and
    ::1, which are one server, not two. IPv6 answers are used when there is no IPv4 one.
    """
    if not spec.startswith("dns:"):
        split_host_port(spec)
        return [spec]
    host, port = split_host_port(spec[len("dns:") :].lstrip("/"), form="dns:///NAME:PORT")
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    v4 = [info for info in infos if info[0] == socket.AF_INET]
    addresses = []
    for family, _, _, _, sockaddr in v4 or infos:
        ip = sockaddr[0]
        address = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        if address not in addresses:
            addresses.append(address)
    return addresses
