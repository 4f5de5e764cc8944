"""GET /: the dashboard, one static page (no build step) that reads the REST API it is served beside."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse

STATIC = Path(__file__).resolve().parent.parent / "static"

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
async def dashboard() -> FileResponse:
    return FileResponse(STATIC / "dashboard.html", media_type="text/html")


@router.get("/static/{name}")
async def static_file(name: str) -> FileResponse:
    files = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
    if name not in files:
        raise HTTPException(status_code=404, detail="no such file")
    return FileResponse(STATIC / name, media_type=files[name])
