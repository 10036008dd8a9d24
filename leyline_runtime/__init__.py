"""Leyline runtime: MLA model, paged KV cache, directive executor, HTTP service."""

from .model import load_model

__all__ = ["load_model"]
