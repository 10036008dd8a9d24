"""The package version: the one source the wheels and the runtime's OpenAPI document read."""

__version__ = "0.1.0"
