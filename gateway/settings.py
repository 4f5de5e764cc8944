"""Settings of `fast gateway`: flags, FAST_GATEWAY_* environment variables or a YAML file.

Each setting is declared once, here (fast/settings.py): the flag, its help, the variable and the key derive from it.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from fast.tls import TlsSettings

ENV_PREFIX = "FAST_GATEWAY_"


class GatewaySettings(TlsSettings):
    # tls_cert, tls_key, tls_ca, tls_server_name (fast/tls.py): how the gateway dials the broker and the
    # learner when their gRPC is TLS (its certificate is then its client certificate).
    host: str = Field(
        "127.0.0.1", description="Address of the REST API to bind; anything but loopback must be asked for."
    )
    port: int = Field(8080, ge=0, le=65535, description="HTTP port; 0 picks a free one and prints it.")
    broker: str = Field("", description="Broker control API HOST:PORT.")
    learner: str = Field("", description="Learner HOST:PORT.")
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

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split(cls, value):
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
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
            raise ValueError("broker is empty; give --broker HOST:PORT of the broker's control API")
        if not self.learner:
            raise ValueError("learner is empty; give --learner HOST:PORT")
        return self
