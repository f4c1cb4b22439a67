"""The admin API: everything under /admin needs an admin key (or development mode); user keys get 403.

One router per resource: personas (admin_personas.py) and identities with their state (admin_identities.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from server.api.deps import require_admin
from server.api.routes import admin_identities, admin_personas
from server.api.schemas import ERROR_RESPONSES

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)], responses=ERROR_RESPONSES)
router.include_router(admin_personas.router)
router.include_router(admin_identities.router)
