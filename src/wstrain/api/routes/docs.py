"""GET /openapi.json and GET /docs behind the bearer token: with WSTRAIN_API_TOKENS set,
create_app turns FastAPI's open schema and UI off and serves these instead (the schema names
every route and field, which is for callers only). With no tokens FastAPI's own serve them.

    curl -H "Authorization: Bearer $WSTRAIN_TOKEN" $S/openapi.json
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from wstrain.api.deps import CallerDep

router = APIRouter()


@router.get("/openapi.json", include_in_schema=False)
async def openapi(request: Request, _: CallerDep) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs", include_in_schema=False)
async def docs(_: CallerDep) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title="wstrain")
