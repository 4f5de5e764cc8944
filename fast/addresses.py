"""Simulator addresses as users write them: `HOST:PORT`, `[IPV6]:PORT`, or `dns:///NAME:PORT`
(one server per address the name resolves to).
A broker of several (`shard: i/n`) keeps its share of a name's replicas: `Shard` below.

Checked before dialling: gRPC takes almost any string as a target and only fails, later and as
UNAVAILABLE, to resolve it. The broker reads its `simulators` setting with `resolve_addresses`;
jobs check `--simulators` with the same rules (jobs/external.py).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

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


def is_dns_name(spec: str) -> bool:
    """`dns:///NAME:PORT` (or `dns:NAME:PORT`): every IP of a name, not one server."""
    return spec.startswith("dns:")


def resolve_addresses(spec: str) -> list[str]:
    """`host:port` as is; `dns:///name:port` (or `dns:name:port`) to one address per IP it resolves to.

    ValueError for an address of neither form; OSError when the name does not resolve.
    IPv4 answers are preferred: a dual-stack name such as localhost resolves to 127.0.0.1 and
    ::1, which are one server, not two. IPv6 answers are used when there is no IPv4 one.
    """
    if not is_dns_name(spec):
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


@dataclass(frozen=True)
class Shard:
    """Broker `index` of `count`: which replicas of a `dns:///NAME:PORT` name it drives.

    The rule: broker i of n keeps the replica at IP address A when int(A) % n == i (A as the
    integer `ipaddress` gives it; IPv4 and IPv6 alike). It depends on the address alone, never on
    the rest of the DNS answer, so that

    - every replica belongs to exactly one broker, whatever each broker read and whenever: brokers
      that start or re-read the name at different moments, or get its answer in another order
      (DNS round-robin shuffles it), never both drive one server nor both leave it out;
    - a replica that comes (a scale-up, a restarted pod with a new IP) joins the broker its
      address names, at that broker's next iteration boundary (broker/run.py re-reads the name
      there); one that goes is marked down by the broker that held it and retried, as any lost
      server; the replicas of the other brokers do not move.

    For addresses in one consecutive block, which is how Docker's and Kubernetes' usual address
    managers hand them out, this is the rule "sorted index % n == i" up to a rotation of the
    shards: the block splits evenly (a shard has floor(k/n) or ceil(k/n) of k replicas). That
    index rule itself is not used because a replica that sorts in before the others shifts their
    indices, and two brokers would then drive one server. Addresses scattered over a subnet can
    split unevenly; each broker logs the replicas it keeps.
    """

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """ "all" (or "0/1") -> every replica; "i/n" -> broker i of n. ValueError naming the value otherwise."""
        text = text.strip()
        if text == "all":
            return cls()
        index, sep, count = text.partition("/")
        if not (sep and index.isascii() and index.isdigit() and count.isascii() and count.isdigit()):
            raise ValueError(f"shard {quote(text)}: expected I/N (broker I of N, 0 <= I < N) or all")
        shard = cls(int(index), int(count))
        if not 0 <= shard.index < shard.count:
            raise ValueError(f"shard {quote(text)}: I must be in 0..N-1 (broker I of N brokers)")
        return shard

    def __str__(self) -> str:
        return "all" if self.count == 1 else f"{self.index}/{self.count}"

    def keeps(self, address: str) -> bool:
        """Whether this broker drives the server at `address` (IP:PORT or [IPV6]:PORT, as resolved)."""
        if self.count == 1:
            return True
        host, _ = split_host_port(address)
        return int(ipaddress.ip_address(host)) % self.count == self.index

    def select(self, addresses: list[str]) -> list[str]:
        """The addresses this broker keeps, in the order given."""
        return [a for a in addresses if self.keeps(a)]


def resolve_shard(spec: str, shard: Shard) -> list[str]:
    """The addresses of `spec` this broker drives: a `dns:` name's replicas that `shard` keeps; a
    HOST:PORT as is (a list given to one broker is that broker's own, never sharded)."""
    addresses = resolve_addresses(spec)
    return shard.select(addresses) if is_dns_name(spec) else addresses
