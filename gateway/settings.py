"""Settings of `fast gateway`: flags, FAST_GATEWAY_* environment variables or a YAML file.

Each setting is declared once, here (fast/settings.py): the flag, its help, the variable and the key derive from it.
"""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator, model_validator

from fast.tls import TlsSettings

ENV_PREFIX = "FAST_GATEWAY_"
MAX_UPSTREAMS = 64  # brokers, and learner ranks: more than any one machine or gateway page serves


class GatewaySettings(TlsSettings):
    # tls_cert, tls_key, tls_ca, tls_server_name (fast/tls.py): how the gateway dials the broker and the
    # learner when their gRPC is TLS (its certificate is then its client certificate).
    host: str = Field(
        "127.0.0.1", description="Address of the REST API to bind; anything but loopback must be asked for."
    )
    port: int = Field(8080, ge=0, le=65535, description="HTTP port; 0 picks a free one and prints it.")
    # Lists, so that one gateway shows a run of R learner ranks with a broker each (`fast train --ranks R`);
    # one address, as before, is a list of one. Broker 0 writes the run's metrics; learner rank 0 alone
    # changes hyper-parameters and writes checkpoints.
    broker: list[str] = Field(
        default_factory=list,
        max_length=MAX_UPSTREAMS,
        description="Broker control API HOST:PORT; with several brokers (one per learner rank) all of them, "
        "comma-separated, broker 0 first.",
    )
    learner: list[str] = Field(
        default_factory=list,
        max_length=MAX_UPSTREAMS,
        description="Learner HOST:PORT; with several learner ranks all of them, comma-separated, rank 0 first.",
    )
    deadline_s: float = Field(
        5.0,
        gt=0.0,
        le=300.0,
        description="Deadline of every upstream call but ExportPolicy and SaveCheckpoint, in seconds.",
    )
    export_deadline_s: float = Field(
        120.0, gt=0.0, le=3600.0, description="Deadline of ExportPolicy and SaveCheckpoint, in seconds."
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Origins allowed to call the API from a browser page served elsewhere, comma-separated; "
        "unset: CORS closed.",
    )
    max_body_bytes: int = Field(64 << 10, ge=1024, le=16 << 20, description="Larger request bodies get 413.")

    @field_validator("broker", "learner", "cors_origins", mode="before")
    @classmethod
    def _split(cls, value):
        # One string from an environment variable or a YAML file: "a:1" or "a:1,b:2".
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("broker", "learner")
    @classmethod
    def _once_each(cls, value: list[str], info: ValidationInfo) -> list[str]:
        for address in value:
            if not address or len(address) > 260 or any(c.isspace() for c in address):
                raise ValueError(f"{address[:60]!r} is not HOST:PORT; give each {info.field_name} as HOST:PORT")
        repeated = sorted({a for a in value if value.count(a) > 1})
        if repeated:
            raise ValueError(f"{repeated[0][:60]!r} is listed twice; give each {info.field_name} once")
        return value

    @field_validator("cors_origins")
    @classmethod
    def _no_wildcard(cls, value: list[str]) -> list[str]:
        if "*" in value:
            raise ValueError("'*' would let any web page steer the run; list the origins, e.g. https://ops.example")
        return value

    @model_validator(mode="after")
    def _needs(self) -> "GatewaySettings":
        if not self.broker:
            raise ValueError(
                "broker is empty; give --broker HOST:PORT of the broker's control API (every broker's, comma-separated)"
            )
        if not self.learner:
            raise ValueError("learner is empty; give --learner HOST:PORT (every rank's, comma-separated, rank 0 first)")
        return self
