"""GET /: the web page (a chat with a persona beside the identity inspector); its files are under /web/.

The page is static (``server/web/static``) and talks to the same API as any client, with the key the person
gives it; serving it needs no key.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from server.web import STATIC

router = APIRouter(tags=["web"], include_in_schema=False)

assets = StaticFiles(directory=STATIC)  # mounted at /web by the app


@router.get("/")
def page() -> FileResponse:
    """The page itself; its script and style sheet come from /web/."""
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})
