"""corral's exception hierarchy, mapped once to OpenAI-style error bodies.

    CorralError                      500 server_error        (never raised bare)
    ├── InternalError                500 code=internal_error  anything unexpected
    ├── ConfigError                  -                       config file/table/key is wrong
    ├── RequestError                 4xx                     the caller can fix it
    │   ├── InvalidRequest           400 invalid_request_error (param names the field)
    │   │   ├── UnsupportedOption    400 code=unsupported_option
    │   │   ├── ContextLengthExceeded 400 code=context_length_exceeded
    │   │   ├── ModelNotLoaded       400 code=model_not_loaded  (autoload off)
    │   │   ├── InvalidConfig        400 code=invalid_config    (reload of a bad config)
    │   │   ├── HubUnauthorized      400 code=hub_unauthorized  (gated or private repo)
    │   │   ├── ModelFileMissing     400 code=model_file_missing
    │   │   ├── UnreadableModel      400 code=unreadable_model  (GGUF header unreadable)
    │   │   ├── NitroLoadFailed      400 code=model_load_failed (Nitro loadmodel of a bad file)
    │   │   ├── InvalidImage         400 code=invalid_image     (not an image, truncated, a bomb...)
    │   │   ├── VisionNotSupported   400 code=vision_not_supported (images to a model without mmproj)
    │   │   ├── InvalidAudio         400 code=invalid_audio     (not audio, truncated, too long, a bomb...)
    │   │   └── AudioNotSupported    400 code=audio_not_supported (audio to a model whose projector does not hear)
    │   ├── AuthenticationError      401 authentication_error
    │   ├── Forbidden                403 code=forbidden
    │   │   ├── PathNotAllowed       403 code=path_not_allowed
    │   │   ├── HostNotAllowed       403 code=host_not_allowed
    │   │   ├── OriginNotAllowed     403 code=origin_not_allowed
    │   │   ├── ImageUrlNotAllowed   403 code=image_url_not_allowed (off, or a private address)
    │   │   ├── PullUrlNotAllowed    403 code=pull_url_not_allowed (a private address, allow_private_pull_urls)
    │   │   ├── NameNotAllowed       403 code=name_not_allowed (a name outside the key's models)
    │   │   └── ScopeDenied          403 code=insufficient_scope (the key lacks the route's scope)
    │   ├── ModelNotFound            404 code=model_not_found
    │   ├── NotFound                 404 (a pull id, a route object)
    │   │   └── RouteNotFound        404 (no such route)
    │   ├── MethodNotAllowed         405
    │   ├── Conflict                 409 (e.g. rm of a loaded model without --force)
    │   ├── PayloadTooLarge          413
    │   ├── UnsupportedMediaType     415 code=unsupported_media_type (a body that is not the route's type)
    │   ├── ClientDisconnected       499 code=client_closed_request (nobody reads the answer)
    │   └── RateLimited              429 code=rate_limit_exceeded + Retry-After, x-ratelimit-*
    ├── Unavailable                  503 + Retry-After      try again later
    │   ├── ModelUnloaded            503 code=model_unloaded   (unloaded while this one waited)
    │   ├── QueueFull                503 code=queue_full
    │   ├── CapacityTimeout          503 code=capacity_timeout (no room within the wait)
    │   ├── ModelLoading             503 code=model_loading    (still loading after the wait)
    │   ├── ClusterUnreachable       503 code=cluster_unreachable (the Ray cluster is lost)
    │   ├── ModelDownloading         503 code=model_downloading
    │   └── HubUnreachable           503 code=hub_unreachable (the Hub is down, slow or failing)
    ├── ModelError                   5xx                    an instance failed
    │   ├── LoadFailed               503 code=model_load_failed
    │   ├── WorkerCrashed            502 code=worker_crashed (in-flight requests end so)
    │   └── WorkerRequestFailed      500                     (the engine failed one request)
    └── DownloadError                500 code=download_failed  reason in words; see store
        ├── DownloadCancelled        409 code=download_cancelled
        ├── DownloadNetworkError     502
        └── InsufficientStorage      507

Every error carries what the HTTP layer needs (status, type, code, param); the API
maps any ``CorralError`` with ``to_body()`` and never lets a traceback out.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "CorralError",
    "ConfigError",
    "RequestError",
    "InvalidRequest",
    "UnsupportedOption",
    "ContextLengthExceeded",
    "ModelNotLoaded",
    "AuthenticationError",
    "Forbidden",
    "PullUrlNotAllowed",
    "PathNotAllowed",
    "HostNotAllowed",
    "OriginNotAllowed",
    "NameNotAllowed",
    "ScopeDenied",
    "InvalidImage",
    "VisionNotSupported",
    "InvalidAudio",
    "AudioNotSupported",
    "ImageUrlNotAllowed",
    "RateLimited",
    "NitroLoadFailed",
    "ModelFileMissing",
    "UnreadableModel",
    "ModelNotFound",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "ClientDisconnected",
    "Unavailable",
    "ModelUnloaded",
    "QueueFull",
    "CapacityTimeout",
    "ModelError",
    "LoadFailed",
    "WorkerCrashed",
    "DownloadError",
    "DownloadCancelled",
    "DownloadNetworkError",
    "InsufficientStorage",
    "InvalidConfig",
    "HubUnauthorized",
    "ModelLoading",
    "ClusterUnreachable",
    "ModelDownloading",
    "HubUnreachable",
    "WorkerRequestFailed",
    "InternalError",
    "RouteNotFound",
    "MethodNotAllowed",
    "error_for_status",
]


class CorralError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        return {}


class InternalError(CorralError):
    """Anything unexpected: the body never carries the exception or a traceback."""

    code = "internal_error"


class ConfigError(CorralError):
    """A config file is wrong. The message names the file, the table and the key."""


class RequestError(CorralError):
    status = 400
    type = "invalid_request_error"


class InvalidRequest(RequestError):
    pass


class UnsupportedOption(InvalidRequest):
    code = "unsupported_option"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class ModelNotLoaded(InvalidRequest):
    code = "model_not_loaded"


class InvalidConfig(InvalidRequest):
    code = "invalid_config"


class HubUnauthorized(InvalidRequest):
    code = "hub_unauthorized"


class ModelFileMissing(InvalidRequest):
    code = "model_file_missing"


class UnreadableModel(InvalidRequest):
    code = "unreadable_model"


class NitroLoadFailed(InvalidRequest):
    code = "model_load_failed"


class InvalidImage(InvalidRequest):
    code = "invalid_image"


class VisionNotSupported(InvalidRequest):
    code = "vision_not_supported"


class InvalidAudio(InvalidRequest):
    code = "invalid_audio"


class AudioNotSupported(InvalidRequest):
    code = "audio_not_supported"


class AuthenticationError(RequestError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(RequestError):
    """The request is understood but not allowed here (a path outside the allowed
    directories, a Host or Origin the server does not serve). The message names the
    setting that would allow it."""
    status = 403
    type = "permission_error"
    code = "forbidden"


class PathNotAllowed(Forbidden):
    code = "path_not_allowed"


class HostNotAllowed(Forbidden):
    code = "host_not_allowed"


class OriginNotAllowed(Forbidden):
    code = "origin_not_allowed"


class ImageUrlNotAllowed(Forbidden):
    code = "image_url_not_allowed"


class PullUrlNotAllowed(Forbidden):
    """A pull URL (or a redirect of it) whose host is an address the policy refuses
    (corral.store.address_policy, ``allow_private_pull_urls``)."""
    code = "pull_url_not_allowed"


class NameNotAllowed(Forbidden):
    """A key named a model (an alias, a Nitro model_id) its ``models`` patterns do not cover."""
    code = "name_not_allowed"


class ScopeDenied(Forbidden):
    """The key is valid but its scopes do not cover the route (see corral.api.scopes)."""
    code = "insufficient_scope"


class ModelNotFound(RequestError):
    status = 404
    code = "model_not_found"


class NotFound(RequestError):
    status = 404
    code = "not_found"


class Conflict(RequestError):
    status = 409
    code = "conflict"


class RouteNotFound(NotFound):
    pass


class MethodNotAllowed(RequestError):
    status = 405
    code = "method_not_allowed"


class PayloadTooLarge(RequestError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(RequestError):
    status = 415
    code = "unsupported_media_type"


class ClientDisconnected(RequestError):
    """The client closed the connection before the answer began (nginx's 499): counted,
    never logged as a failure; the response sent for it goes nowhere."""
    status = 499
    code = "client_closed_request"


class RateLimited(RequestError):
    """A key went over one of its limits (requests or tokens per minute, tokens per day,
    requests in flight or waiting). ``type`` says which kind, as OpenAI does ("requests",
    "tokens"); the headers carry Retry-After and the key's x-ratelimit-* state."""
    status = 429
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: float, kind: str = "requests",
                 limit_headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.type = kind
        self.retry_after_s = retry_after_s
        self.limit_headers = dict(limit_headers or {})

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s))), **self.limit_headers}


class Unavailable(CorralError):
    status = 503
    type = "server_error"
    code = "unavailable"

    def __init__(self, message: str, *, retry_after_s: float = 1.0, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class ModelUnloaded(Unavailable):
    """The model was unloaded (by another request) while this one waited for it to load.
    A request goes back to the top (autoload again); an explicit load answers 409."""
    code = "model_unloaded"


class QueueFull(Unavailable):
    code = "queue_full"


class CapacityTimeout(Unavailable):
    code = "capacity_timeout"


class ModelLoading(Unavailable):
    code = "model_loading"


class ClusterUnreachable(Unavailable):
    """The router lost its Ray cluster (``[server] ray_address``) and is reconnecting."""
    code = "cluster_unreachable"


class ModelDownloading(Unavailable):
    code = "model_downloading"


class HubUnreachable(Unavailable):
    """A search, listing or header read the Hugging Face Hub did not answer in time, or
    answered with a failure (api/page/hub.py)."""
    code = "hub_unreachable"


class ModelError(CorralError):
    status = 503
    type = "server_error"


class LoadFailed(ModelError):
    code = "model_load_failed"


class WorkerCrashed(ModelError):
    status = 502
    code = "worker_crashed"


class WorkerRequestFailed(ModelError):
    status = 500


class DownloadError(CorralError):
    """A download failed; ``message`` is a reason a person understands."""

    code = "download_failed"


class DownloadCancelled(DownloadError):
    status = 409
    code = "download_cancelled"


class DownloadNetworkError(DownloadError):
    status = 502


class InsufficientStorage(DownloadError):
    status = 507


_HTTP_ERRORS: dict[int, type[CorralError]] = {404: RouteNotFound, 405: MethodNotAllowed}


def error_for_status(status: int, message: str) -> CorralError:
    """The error for an HTTP status the web framework decided (unknown route, wrong
    method...): one leaf class per status."""
    cls = _HTTP_ERRORS.get(status)
    if cls is None:
        base: type[CorralError] = RequestError if status < 500 else CorralError
        cls = type(f"HTTP{status}Error", (base,), {"status": status, "code": None})
        _HTTP_ERRORS[status] = cls
    return cls(message)
