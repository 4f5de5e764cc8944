"""Settings of `fast sim-server`: flags, FAST_SIM_* environment variables or a YAML file."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from fast.tls import TlsSettings
from sim_server.cost_model import CostModelConfig, CostPreset, cost_model_config
from sim_server.environments import EnvSpec

ENV_PREFIX = "FAST_SIM_"


class SimServerConfig(TlsSettings):  # tls_cert, tls_key, tls_ca, tls_server_name: fast/tls.py
    env: EnvSpec = "takeover"  # "takeover" or "gym:<Gymnasium id>"
    slots: int = Field(8, ge=1, le=4096)
    processes: int | None = Field(None, ge=1, le=1024)  # worker processes holding the slots (sim_server/workers.py)
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)  # 0 picks a free port and prints it
    seed: int = 0  # catalog seed of the takeover workload
    num_clips: int | None = Field(None, ge=1)  # catalog size; None: the env's default
    env_kwargs: dict[str, Any] = Field(default_factory=dict)  # passed to gym.make
    cost_preset: CostPreset = "off"
    step_latency_s: float | None = None  # overrides of the preset's knobs
    reset_fixed_s: float | None = None
    map_load_s: float | None = None
    map_load_cached_s: float | None = None
    prefetch_step_penalty: float | None = None
    max_message_bytes: int = Field(64 << 20, ge=1024)
    grace_s: float = Field(5.0, ge=0.0)
    # Capabilities it advertises and honours; false emulates a server without them (StepStream,
    # or a Reset of several slots, is then refused with UNIMPLEMENTED).
    step_stream: bool = True
    batched_reset: bool = True
    prefetch: bool = True  # Prepare (background loads of slots' next clips)
    # Also serve Step on a Unix socket for a broker on this machine (sim_server/local_step.py), in a
    # private directory made under `local_step_dir` (None: the system's temporary directory).
    local_step: bool = True
    local_step_dir: str | None = None

    def cost_model(self) -> CostModelConfig:
        return cost_model_config(
            self.cost_preset,
            step_latency_s=self.step_latency_s,
            reset_fixed_s=self.reset_fixed_s,
            map_load_s=self.map_load_s,
            map_load_cached_s=self.map_load_cached_s,
            prefetch_step_penalty=self.prefetch_step_penalty,
        )
