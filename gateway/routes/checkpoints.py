"""GET and POST /v1/checkpoints (list, save now) and GET /v1/policy (the current policy as a model file)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from fast.v1 import learner_pb2
from gateway.convert import to_plain
from gateway.deps import Authorized, UpstreamsDep
from gateway.models import AUTH_RESPONSES, Checkpoint, SavedCheckpoint

router = APIRouter(prefix="/v1", tags=["checkpoints"])


class PolicyFormat(str, Enum):
    torchscript = "torchscript"
    onnx = "onnx"


_FORMATS = {
    PolicyFormat.torchscript: (learner_pb2.POLICY_FORMAT_TORCHSCRIPT, "pt"),
    PolicyFormat.onnx: (learner_pb2.POLICY_FORMAT_ONNX, "onnx"),
}


@router.get("/checkpoints", response_model=list[Checkpoint])
async def list_checkpoints(upstreams: UpstreamsDep) -> list[Checkpoint]:
    return [Checkpoint.model_validate(to_plain(c)) for c in await upstreams.checkpoints()]


@router.post(
    "/checkpoints",
    status_code=201,
    response_model=SavedCheckpoint,
    dependencies=[Authorized],
    responses=AUTH_RESPONSES,
)
async def save_checkpoint(upstreams: UpstreamsDep) -> SavedCheckpoint:
    return SavedCheckpoint.model_validate(to_plain(await upstreams.save_checkpoint()))


@router.get(
    "/policy",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "The model file"}},
)
async def download_policy(
    upstreams: UpstreamsDep,
    format: Annotated[PolicyFormat, Query(description="torchscript (torch.jit.load) or onnx (onnxruntime)")],
) -> Response:
    """The current policy as a model that runs without FAST: observations float32 [batch, *obs shape] in,
    the deterministic action out (the Gaussian's mean clipped to the Box, or the arg-max)."""
    code, suffix = _FORMATS[format]
    reply = await upstreams.export_policy(code)
    name = f"fast-policy-v{reply.policy_version}.{suffix}"
    return Response(
        content=reply.model,
        media_type="application/octet-stream",
        headers={
            "Content-Disposition": f'attachment; filename="{name}"',
            "X-Policy-Version": str(reply.policy_version),
            "X-Observation-Shape": ",".join(str(d) for d in reply.observation_shape),
        },
    )
