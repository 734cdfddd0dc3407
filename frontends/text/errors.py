"""llama-server's error shape and the Falcon handlers that produce it.

Every error a client sees is ``{"error": {"code", "message", "type"}}`` with
llama-server's type names (server-common.cpp). Client mistakes are
``ApiError``s raised before anything reaches the engine; only a real bug ends
in the catch-all handler, which logs the traceback and answers 500.
"""
from __future__ import annotations

import logging

import falcon

log = logging.getLogger("ringserve")

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class ApiError(Exception):
    """An error answered with llama-server's JSON shape."""

    def __init__(self, code: int, message: str, type: str | None = None, **extra):
        super().__init__(message)
        self.code, self.message = code, message
        self.type = type or TYPES.get(code, "server_error")
        self.extra = extra

    def body(self) -> dict:
        err = {"code": self.code, "message": self.message, "type": self.type}
        err.update(self.extra)
        return {"error": err}


def bad(message: str) -> ApiError:
    return ApiError(400, message)


def unavailable(message: str = "Loading model") -> ApiError:
    return ApiError(503, message)


def exceed_context(n_prompt: int, n_ctx: int) -> ApiError:
    return ApiError(
        400,
        f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it",
        "exceed_context_size_error",
        n_prompt_tokens=n_prompt,
        n_ctx=n_ctx,
    )


def _answer(resp: falcon.Response, err: ApiError) -> None:
    resp.status = falcon.code_to_http_status(err.code)
    resp.media = err.body()
    resp.stream = None


def on_api_error(req, resp, ex: ApiError, params) -> None:
    _answer(resp, ex)


def on_http_error(req, resp, ex: falcon.HTTPError, params) -> None:
    """Falcon's own errors (no route, bad method, bad header) in our shape.

    An unknown path or method is llama-server's 404 "File Not Found" (its
    router has no method-not-allowed answer).
    """
    code = ex.status_code
    if code in (404, 405):
        err = ApiError(404, "File Not Found")
    else:
        err = ApiError(code, ex.description or ex.title or "error")
    _answer(resp, err)
    for k, v in (ex.headers or {}).items():
        if k.lower() in ("www-authenticate", "retry-after"):
            resp.set_header(k, v)


def on_exception(req, resp, ex: Exception, params) -> None:
    """Catch-all: a bug. Log it with the request line, answer 500."""
    log.exception("unhandled error on %s %s", req.method, req.path)
    _answer(resp, ApiError(500, f"internal error: {type(ex).__name__}"))


def install(app: falcon.App) -> None:
    # Falcon picks the most specific handler by the exception's MRO.
    app.add_error_handler(Exception, on_exception)
    app.add_error_handler(falcon.HTTPError, on_http_error)
    app.add_error_handler(ApiError, on_api_error)
