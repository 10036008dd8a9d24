"""Request models whose numbers are JSON's: the server takes what the OpenAPI document declares.

pydantic's lax mode takes ``true`` for the integer 1 and ``"5"`` for 5; JSON Schema, which the document
is written in (and which clients and schemathesis read), calls neither a number. And the document bounds
every integer to JSON's exact range, ±(2^53 - 1) (RFC 7493, I-JSON), where Python would take any size.
:class:`JsonModel` closes both gaps for every field whose type is a number (alone, optional, in a list
or as a mapping's values), with one validator; a number written ``5.0`` stays an integer, as JSON Schema has it.
"""

from __future__ import annotations

import types
import typing
from functools import cache
from typing import Any

from pydantic import BaseModel, model_validator

JSON_SAFE_INT = 2**53 - 1


class JsonModel(BaseModel):
    """A request body's model: booleans and strings are not numbers, integers stay within ±(2^53 - 1)."""

    @model_validator(mode="before")
    @classmethod
    def _json_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, (scalar, in_lists, text_too) in _number_kinds(cls).items():
            alias = cls.model_fields[name].alias
            if (key := alias if alias in data else name) not in data:
                continue
            value = data[key]
            if scalar and value is not None and not (text_too and isinstance(value, str)) \
                    and not isinstance(value, (list, dict)):
                _check(value, name)
            items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
            if in_lists:
                for item in items:
                    if not isinstance(item, dict):  # a list of objects is another branch of the type
                        _check(item, name)
        return data


def _check(value: Any, field: str | None) -> None:
    if isinstance(value, (bool, str)):
        raise ValueError(f"{field} takes a JSON number, not {type(value).__name__} {value!r}")
    if isinstance(value, int) and not -JSON_SAFE_INT <= value <= JSON_SAFE_INT:
        raise ValueError(f"{field}: {value} is outside JSON's exact integer range ±(2^53 - 1)")


@cache
def _number_kinds(model: type[BaseModel]) -> dict[str, tuple[bool, bool, bool]]:
    """Per field typed with numbers: (a number itself, numbers in a list or as a mapping's values, a string
    also allowed)."""
    out = {}
    for name, field in model.model_fields.items():
        scalar, in_lists, text = _walk(field.annotation)
        if scalar or in_lists:
            out[name] = (scalar, in_lists, text)
    return out


def _walk(annotation: Any) -> tuple[bool, bool, bool]:
    origin = typing.get_origin(annotation)
    if annotation in (int, float):
        return True, False, False
    if annotation is str:
        return False, False, True
    if origin is typing.Annotated:
        return _walk(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        parts = [_walk(a) for a in typing.get_args(annotation)]
        return any(p[0] for p in parts), any(p[1] for p in parts), any(p[2] for p in parts)
    if origin in (list, dict):  # a list's items, a mapping's values
        scalar, _, _ = _walk(typing.get_args(annotation)[-1]) if typing.get_args(annotation) else (False,) * 3
        return False, scalar, False
    return False, False, False
