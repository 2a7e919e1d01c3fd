"""Standard Agents runtime for Python."""

# the one version number: `GET /health`, the OpenAPI document's `info.version`; `pyproject.toml` says the same
# (tests/test_openapi.py checks)
__version__ = "0.1.0"
