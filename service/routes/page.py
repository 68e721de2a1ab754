"""The web page: HTML, CSS and JavaScript served as they are (no build step)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(tags=["page"])

PAGE = Path(__file__).resolve().parent.parent / "static" / "index.html"


@router.get("/", response_class=HTMLResponse, summary="The search page", include_in_schema=True)
def index_page() -> HTMLResponse:
    """Search by label name (with autocompletion) or by a picture; `/?q=<label>&mode=<mode>`
    runs that search on load."""
    return HTMLResponse(PAGE.read_text(encoding="utf-8"), headers={"Cache-Control": "no-cache"})
