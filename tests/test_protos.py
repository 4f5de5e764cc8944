"""The proto API as a contract: generated code is current, and protos/ alone makes a client."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import sim_server

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gen_protos  # noqa: E402


def test_generated_code_matches_protos(tmp_path: Path) -> None:
    written = gen_protos.generate(tmp_path)
    assert written, "protoc wrote nothing"
    for fresh in written:
        committed = ROOT / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run python scripts/gen_protos.py"
        assert committed.read_text() == fresh.read_text(), f"{committed} is stale: run python scripts/gen_protos.py"


def test_every_message_and_field_is_commented() -> None:
    for proto in (ROOT / "protos").rglob("*.proto"):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            stripped = line.strip()
            is_decl = stripped.startswith(("message ", "enum ", "rpc ", "service ")) or (
                stripped.endswith(";") and "=" in stripped and not stripped.startswith(("syntax", "option", "//"))
            )
            if is_decl:
                assert lines[i - 1].strip().startswith("//"), f"{proto.name}:{i + 1} has no comment: {stripped}"


CLIENT = textwrap.dedent(
    """
    import os
    import sys
    import grpc
    import numpy as np
    from fast.v1 import simulator_pb2 as pb, simulator_pb2_grpc as pb_grpc, tensor_pb2 as tpb
    import fast.v1.simulator_pb2 as generated
    assert generated.__file__.startswith(sys.argv[2]), generated.__file__  # stubs from protos/ only
    assert "sim_server" not in sys.modules
    # Every call but health carries the run token (docs/security.md); here from the file the
    # services were given, in FAST_AUTH_TOKEN_FILE.
    with open(os.environ["FAST_AUTH_TOKEN_FILE"]) as file:
        auth = [("authorization", "Bearer " + file.read().strip())]
    with grpc.insecure_channel(sys.argv[1]) as channel:
        stub = pb_grpc.SimulatorStub(channel)
        try:
            stub.Describe(pb.DescribeRequest(), timeout=10)  # no token
            raise AssertionError("a call without the token was answered")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc
        d = stub.Describe(pb.DescribeRequest(), timeout=10, metadata=auth)
        r = stub.Reset(pb.ResetRequest(slot_ids=[0, 1], clip_ids=[3, 4], seeds=[0, 0]), timeout=10, metadata=auth)
        assert r.observations.dtype == tpb.DTYPE_FLOAT32 and list(r.observations.shape)[0] == 2
        shape = [2] + list(d.action_space.shape)
        actions = tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=shape, data=np.zeros(shape, "<f4").tobytes())
        s = stub.Step(pb.StepRequest(slot_ids=[0, 1], actions=actions), timeout=10, metadata=auth)
        rewards = np.frombuffer(s.rewards.data, "<f4")
        print("OK", d.env_id, d.num_slots, d.num_clips, rewards.shape[0])
    """
)


def test_client_from_protos_alone_drives_server(tmp_path: Path) -> None:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'protos'}",
            f"--python_out={stubs}",
            f"--grpc_python_out={stubs}",
            "fast/v1/simulator.proto",
            "fast/v1/tensor.proto",
        ],
        check=True,
        cwd=tmp_path,
        capture_output=True,
    )
    (stubs / "fast" / "__init__.py").write_text("")
    (stubs / "fast" / "v1" / "__init__.py").write_text("")
    script = stubs / "client.py"
    script.write_text(CLIENT)
    with sim_server("--env", "takeover", "--slots", "4") as server:
        out = subprocess.run(
            [sys.executable, str(script), server.address, str(stubs)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["OK", "takeover", "4", "200", "2"]


def test_every_generated_module_imports_together() -> None:
    """One descriptor pool holds every fast.v1 file: a name defined twice would fail here."""
    import importlib

    names = sorted(p.stem for p in (ROOT / "fast" / "v1").glob("*_pb2*.py"))
    assert {"simulator_pb2", "learner_pb2", "broker_pb2", "tensor_pb2"} <= set(names)
    for name in names:
        importlib.import_module(f"fast.v1.{name}")
