"""The bundled server's own response models: ``/v1/models`` and ``/healthz``.

The chat-completions models are every engine's (:mod:`leyline_runtime.api.chat_request`,
:mod:`leyline_runtime.api.chat_response`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["Health", "ModelCard", "ModelList"]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "leyline"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    durability: Literal["memory", "snapshot"] = Field(
        description="`memory`: sessions are a cache and a restart loses them; `snapshot`: their message "
                    "histories are saved on shutdown and prefilled again at start (`--state-dir`)")
