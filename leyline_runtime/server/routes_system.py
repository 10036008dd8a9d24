"""Health (open, no key needed) and Prometheus metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from ..metrics import CONTENT_TYPE
from ..api.errors import error_responses
from .openai_schema import Health
from .auth import Caller, current_caller
from .routes_sessions import MetricsDep

router = APIRouter(tags=["system"])


@router.get("/healthz", response_model=Health, summary="Liveness; never needs an API key")
async def healthz(request: Request) -> Health:
    return Health(model=request.app.state.runtime.config.model_name,
                  durability="snapshot" if request.app.state.state_dir else "memory")


@router.get("/metrics", response_class=Response,
            summary="Prometheus metrics (text exposition format): the caller's tenant, or all with an admin key",
            responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}}},
                       **error_responses()})
async def metrics(metrics: MetricsDep, caller: Annotated[Caller, Depends(current_caller)]) -> Response:
    return Response(metrics.render(None if caller.admin else caller.tenant), media_type=CONTENT_TYPE)
