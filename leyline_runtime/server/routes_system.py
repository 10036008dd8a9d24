"""Health (open, no key needed) and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ..metrics import CONTENT_TYPE
from .errors import error_responses
from .openai_schema import Health
from .routes_sessions import MetricsDep, Tenant

router = APIRouter(tags=["system"])


@router.get("/healthz", response_model=Health, summary="Liveness; never needs an API key")
async def healthz(request: Request) -> Health:
    return Health(model=request.app.state.runtime.config.model_name)


@router.get("/metrics", response_class=Response, summary="Prometheus metrics (text exposition format)",
            responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}}},
                       **error_responses()})
async def metrics(metrics: MetricsDep, tenant: Tenant) -> Response:
    return Response(metrics.render(), media_type=CONTENT_TYPE)
