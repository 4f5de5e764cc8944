"""Settings of `fast sim-server`: flags, FAST_SIM_* environment variables or a YAML file.

Each setting is declared once, here (fast/settings.py): the flag, its help, the variable and the key derive from it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from fast.settings import Flag
from fast.tls import TlsSettings
from sim_server.cost_model import CostModelConfig, CostPreset, cost_model_config
from sim_server.environments import EnvSpec

ENV_PREFIX = "FAST_SIM_"


class SimServerConfig(TlsSettings):  # tls_cert, tls_key, tls_ca, tls_server_name: fast/tls.py
    env: EnvSpec = Field(
        "takeover",
        description="'takeover', 'gym:<Gymnasium id>', 'gym:<module>:<env factory>' or "
        "'slot:<module>:<SlotEnv factory>'.",
    )
    slots: int = Field(8, ge=1, le=4096, description="Number of slots.")
    processes: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Spread the slots over N worker processes, each stepping its engines in its main thread "
        "(one engine per process when N = slots; sim_server/workers.py); unset: the server process steps them.",
    )
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(0, ge=0, le=65535, description="Port; 0 picks a free one and prints it.")
    seed: int = Field(0, description="Catalog seed of the takeover workload.")
    num_clips: int | None = Field(None, ge=1, description="Catalog size; unset: the env's (200 takeover, 1000 gym).")
    env_kwargs: Annotated[dict[str, Any], Flag("--env-kwarg")] = Field(
        default_factory=dict, description="KEY=VALUE passed to gym.make or the env factory (VALUE read as YAML)."
    )
    cost_preset: CostPreset = Field(
        "off", description="Emulated costs: off | calibrated | parallel | step-only | vectorized (docs/cost_model.md)."
    )
    # Overrides of the preset's knobs (unset: the preset's own).
    step_latency_s: float | None = Field(None, description="Override the preset's step latency.")
    reset_fixed_s: float | None = Field(None, description="Override the preset's fixed reset cost.")
    map_load_s: float | None = Field(None, description="Override the preset's map load cost.")
    map_load_cached_s: float | None = Field(None, description="Override the preset's cached map load cost.")
    prefetch_step_penalty: float | None = Field(
        None,
        description="Fraction added to the step latency while a Prepare's background load runs; "
        "unset: the preset's (0).",
    )
    max_message_bytes: int = Field(64 << 20, ge=1024, description="Largest message accepted, in bytes.")
    grace_s: float = Field(5.0, ge=0.0, description="Drain time on SIGTERM, in seconds.")
    # Capabilities it advertises and honours; false emulates a server without them (StepStream,
    # or a Reset of several slots, is then refused with UNIMPLEMENTED).
    step_stream: bool = Field(
        True, description="Serve StepStream; off emulates a server without it (advertised false, refused)."
    )
    batched_reset: bool = Field(
        True, description="Reset several slots in one call; off emulates a server that resets one slot per call."
    )
    prefetch: bool = Field(
        True, description="Serve Prepare (background loads of slots' next clips); off emulates a server without it."
    )
    # Also serve Step on a Unix socket for a broker on this machine (sim_server/local_step.py), in a
    # private directory made under `local_step_dir` (None: the system's temporary directory).
    local_step: bool = Field(
        True,
        description="Also serve Step on a Unix socket, which a broker on this machine may step over "
        "(sim_server/local_step.py).",
    )
    local_step_dir: str | None = Field(
        None, description="Where the local step socket's private directory is made; unset: the system's temp dir."
    )

    def cost_model(self) -> CostModelConfig:
        return cost_model_config(
            self.cost_preset,
            step_latency_s=self.step_latency_s,
            reset_fixed_s=self.reset_fixed_s,
            map_load_s=self.map_load_s,
            map_load_cached_s=self.map_load_cached_s,
            prefetch_step_penalty=self.prefetch_step_penalty,
        )
