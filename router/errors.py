"""OpenAI-style errors: every error a client can cause becomes one of these, never a traceback.

Plain exceptions (a status, a body, headers): router/http/middleware.py turns them into
responses, so this layer stays free of HTTP machinery.
"""

from __future__ import annotations


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type
        self.headers = headers

    def body(self) -> dict:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": error}

    def anthropic_body(self) -> dict:
        """The same error in the Anthropic Messages API's shape (for /v1/messages)."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


NO_VISION = "image_input_unsupported"  # the code of every "this model takes no images" 400


def bad_image(message: str, param: str | None, code: str = "invalid_image") -> ApiError:
    """An image part that can't be used (docs/api.md, "Images", lists the codes)."""
    return bad_request(message, param, code)


def no_vision(message: str, param: str | None = None) -> ApiError:
    """An image sent where images are not served: a text-only model, a vision family not
    placed yet, or workers started without the vision extra."""
    return bad_request(message, param, NO_VISION)


WRONG_TASK = "model_task_mismatch"  # the code of "this model does not serve this endpoint"


def not_an_embedding_model(model: str) -> ApiError:
    return bad_request(
        f"The model '{model}' is a chat model and does not serve embeddings; send "
        "/v1/embeddings to an embedding model (GET /v1/models lists them)",
        "model",
        WRONG_TASK,
    )


def only_embeddings(model: str, path: str) -> ApiError:
    return bad_request(
        f"The model '{model}' is an embedding model: it serves /v1/embeddings only, not {path}",
        "model",
        WRONG_TASK,
    )


def embedding_failed(message: str) -> ApiError:
    return ApiError(500, message, code="embedding_failed", type="server_error")


def no_workers(model: str) -> ApiError:
    return ApiError(
        503,
        f"no healthy worker serves '{model}' now; try again later",
        code="no_workers_available",
        type="service_unavailable_error",
    )


def overloaded() -> ApiError:
    return ApiError(
        429,
        "the router has too many requests in flight; retry after a short wait",
        code="rate_limit_exceeded",
        type="rate_limit_error",
    )


def generation_failed(message: str) -> ApiError:
    return ApiError(500, message, code="generation_failed", type="server_error")


def missing_api_key() -> ApiError:
    return ApiError(
        401,
        "You didn't provide an API key. Send it in the Authorization header: "
        "'Authorization: Bearer YOUR_KEY'.",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def wrong_api_key() -> ApiError:
    return ApiError(  # never echo the key back: it may be a real key for something else
        401,
        "Incorrect API key provided.",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def key_busy(limit: int) -> ApiError:
    return ApiError(
        429,
        f"this API key already has {limit} requests in flight, the most allowed; "
        "retry when one finishes",
        code="rate_limit_exceeded",
        type="rate_limit_error",
    )


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than the router's limit of {limit} bytes",
        code="request_too_large",
    )


def model_unavailable(message: str, code: str, retry_after_s: float | None = None) -> ApiError:
    """503 for a catalog model that is not loaded and cannot be now (router/placement/)."""
    headers = None if retry_after_s is None else {"Retry-After": str(max(1, round(retry_after_s)))}
    return ApiError(503, message, "model", code, "service_unavailable_error", headers)
