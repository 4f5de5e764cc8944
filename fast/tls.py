"""Optional TLS for every FAST service and client: the settings they share, and the gRPC credentials.

A party's TLS is three files and a name (`TlsFiles`):
  cert, key     its certificate chain and private key (PEM). A server serves them; a client shows
                them to a server that asks for a client certificate (mutual TLS).
  ca            the CA certificate it trusts. A client checks the server's certificate against it
                (None: the system's roots); a server that has one requires every client to show a
                certificate that CA signed (mutual TLS, used for the simulators' connections).
  server_name   the name a client checks the server's certificate against instead of the address
                it dials, for servers reached by IP (the broker resolves dns:/// to pod IPs).
Every service takes them as settings tls_cert, tls_key, tls_ca, tls_server_name (`TlsSettings`,
e.g. FAST_SIM_TLS_CERT); a service with any of them serves TLS only, and the broker dials the
simulators and the learner with its own. All off: insecure channels, as on loopback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
from pydantic import Field, model_validator

from fast.settings import Settings


@dataclass(frozen=True)
class TlsFiles:
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls_cert and tls_key go together: give both, the certificate and its private key")

    @property
    def on(self) -> bool:
        return any(value is not None for value in (self.cert, self.key, self.ca, self.server_name))


def _read(path: Path, setting: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{setting} {path}: {exc.strerror or exc}") from None


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """The certificate and key served; with a CA, client certificates signed by it are required."""
    if tls.cert is None or tls.key is None:
        raise ValueError("a TLS server needs tls_cert and tls_key (its certificate and private key)")
    pair = (_read(tls.key, "tls_key"), _read(tls.cert, "tls_cert"))
    if tls.ca is None:
        return grpc.ssl_server_credentials([pair])
    return grpc.ssl_server_credentials([pair], root_certificates=_read(tls.ca, "tls_ca"), require_client_auth=True)


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    """Verify the server with the CA (the system's roots without one); show cert and key when given."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca, "tls_ca") if tls.ca is not None else None,
        private_key=_read(tls.key, "tls_key") if tls.key is not None else None,
        certificate_chain=_read(tls.cert, "tls_cert") if tls.cert is not None else None,
    )


def channel_options(tls: TlsFiles) -> list[tuple[str, str]]:
    return [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []


class TlsSettings(Settings):
    """The TLS settings of a service's config (a base class: FAST_<SERVICE>_TLS_CERT and so on)."""

    tls_cert: Path | None = Field(
        None, description="TLS: PEM certificate chain served (and shown to servers that ask); docs/security.md."
    )
    tls_key: Path | None = Field(None, description="TLS: the certificate's PEM private key.")
    tls_ca: Path | None = Field(
        None, description="TLS: PEM CA that clients verify servers with; a server with it requires client certificates."
    )
    tls_server_name: str | None = Field(
        None, description="TLS: the name servers' certificates are checked against, when dialled by IP."
    )

    @model_validator(mode="after")
    def _tls_complete(self):
        tls = self.tls
        if tls.on and tls.cert is None:
            raise ValueError(
                "TLS is on (a tls_* setting is given) but tls_cert and tls_key are not: a service with TLS "
                "serves TLS only and needs its certificate and private key"
            )
        return self

    @property
    def tls(self) -> TlsFiles:
        return TlsFiles(self.tls_cert, self.tls_key, self.tls_ca, self.tls_server_name)
