"""Dependencies the routes share: the upstreams, and the run token that every mutating route requires."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.upstream import Upstreams

_bearer = HTTPBearer(auto_error=False, description="The run's token: `Authorization: Bearer <token>`")


def get_upstreams(request: Request) -> Upstreams:
    return request.app.state.upstreams


def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """401 without a bearer token, 403 with a wrong one; compared in constant time."""
    if credentials is None or not credentials.credentials:
        raise HTTPException(
            status_code=401,
            detail="this call changes the run; send the run's token as 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    expected: bytes = request.app.state.token.encode()
    if not hmac.compare_digest(credentials.credentials.encode("utf-8", "replace"), expected):
        raise HTTPException(status_code=403, detail="the bearer token is not this run's token")


UpstreamsDep = Annotated[Upstreams, Depends(get_upstreams)]
Authorized = Depends(require_token)
