"""Deployment files validate offline: Compose with the real Compose program, Kubernetes strictly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import compose
import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_BIN = Path(compose.__file__).parent / "docker-compose"  # the Go binary, not the Python wrapper


def _compose_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(COMPOSE_BIN), "-f", str(path), "config", "-q"], capture_output=True, text=True, timeout=60)


def test_docker_compose_file_is_valid() -> None:
    result = _compose_config(ROOT / "docker-compose.yml")
    assert result.returncode == 0, result.stderr


def test_compose_validation_catches_errors(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text((ROOT / "docker-compose.yml").read_text().replace("stop_grace_period: 10s", "stop_grace_period: [10]"))
    assert _compose_config(broken).returncode != 0


@pytest.mark.parametrize("manifest", sorted((ROOT / "deploy" / "k8s").glob("*.yaml")), ids=lambda p: p.name)
def test_kubernetes_manifest_is_valid(manifest: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", str(manifest)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_copies_every_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) ", dockerfile, flags=re.M))
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert packages <= copied, f"Dockerfile does not copy {sorted(packages - copied)}"
