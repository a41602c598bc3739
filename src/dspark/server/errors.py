"""Errors of the HTTP API: one JSON shape, ``{"error": {"message", "type"}}``, and the right status.

Bad input is always a 4xx (DESIGN §10): FastAPI's own validation errors (malformed JSON,
wrong types, out-of-range values) become 400s in the OpenAI shape instead of FastAPI's
422 ``{"detail": [...]}``; a 5xx means the server is broken (engine dead: 503) or has a
bug (500, logged with its traceback).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

_TYPE_OF_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """An error answered as ``status`` with ``{"error": {"message", "type"}}``."""

    def __init__(self, status: int, message: str, type: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers
        self.type = type or _TYPE_OF_STATUS.get(status, "server_error")


def error_body(message: str, type: str) -> dict:
    return {"error": {"message": message, "type": type}}


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error_body(error.message, error.type), error.status, headers=error.headers)


def validation_message(exc: RequestValidationError) -> str:
    """One line naming each bad field, e.g. ``max_tokens: Input should be greater than or equal to 1``."""
    parts = []
    for err in exc.errors()[:5]:
        if err.get("type") == "json_invalid":
            return f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}"
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error in the OpenAI shape; never a 5xx for a request's content."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        if isinstance(exc.body, bytes):  # FastAPI parses only JSON content types (curl -d sends a form)
            return error_response(
                ApiError(400, "the request body must be JSON (Content-Type: application/json)")
            )
        return error_response(ApiError(400, validation_message(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return error_response(ApiError(status, message, headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "server_error"), 500)
