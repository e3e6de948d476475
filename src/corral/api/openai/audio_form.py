"""OpenAI's multipart form of ``/v1/audio/transcriptions`` and ``/v1/audio/translations``,
parsed in memory and checked.

The body is already bounded by the guard (``max_audio_bytes_per_request`` and a little for
the fields, on these routes only); ``parse_form`` splits it with python-multipart's
streaming parser into fields and files in memory (Starlette's own form parser spools
files over 1 MiB to the system's temporary directory, which corral does not own). At most
``max_files`` files and 64 fields of at most 64 KiB each: more is a 400 naming the part.

``TranscriptionForm.of(form, translate)`` is the request: ``file`` (one), ``model``,
``language``, ``prompt``, ``response_format`` (json, text, srt, vtt, verbose_json),
``temperature``, ``timestamp_granularities[]`` (``segment``; ``word`` is a 400), ``stream``,
and corral's ``max_tokens`` (each window's; a form field OpenAI's SDK sends via ``extra_body``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, cast

from python_multipart.multipart import MultipartParser, parse_options_header

from corral.errors import InvalidRequest, UnsupportedOption

__all__ = ["FormFile", "Form", "TranscriptionForm", "parse_form", "RESPONSE_FORMATS"]

_MAX_FIELDS = 64
_MAX_FIELD_BYTES = 64 * 1024
RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]


@dataclass
class FormFile:
    name: str  # the form field ("file")
    filename: str
    content_type: str
    data: bytes


@dataclass
class Form:
    fields: dict[str, list[str]] = field(default_factory=dict)
    files: list[FormFile] = field(default_factory=list)

    def one(self, name: str) -> str | None:
        values = self.fields.get(name)
        if not values:
            return None
        if len(values) > 1:
            raise InvalidRequest(f"{name}: given {len(values)} times", param=name)
        return values[0]


def parse_form(body: bytes, content_type: str, max_files: int) -> Form:
    """The multipart body's fields and files; 400s for a body that is not a form or is over
    the counts."""
    kind, params = parse_options_header(content_type)
    if kind != b"multipart/form-data" or not params.get(b"boundary"):
        raise InvalidRequest("the body must be multipart/form-data (OpenAI's audio form: file, model, ...)")
    form = Form()
    state: dict[str, Any] = {"headers": {}, "field": b"", "value": b"", "data": [], "size": 0}

    def on_part_begin() -> None:
        state.update(headers={}, data=[], size=0)

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state["value"] += data[start:end]

    def on_header_end() -> None:
        state["headers"][state["field"].lower()] = state["value"]
        state["field"], state["value"] = b"", b""

    def on_part_data(data: bytes, start: int, end: int) -> None:
        state["data"].append(data[start:end])
        state["size"] += end - start

    def on_part_end() -> None:
        disp, opts = parse_options_header(state["headers"].get(b"content-disposition", b""))
        name = opts.get(b"name", b"").decode("utf-8", "replace")
        if disp != b"form-data" or not name:
            raise InvalidRequest("a part of the form has no name (Content-Disposition: form-data; name=...)")
        if b"filename" in opts:
            if len(form.files) >= max_files:
                raise InvalidRequest(f"{name}: the form holds more than {max_files} files", param=name)
            form.files.append(FormFile(name, opts[b"filename"].decode("utf-8", "replace"),
                                       state["headers"].get(b"content-type", b"").decode("latin-1"),
                                       b"".join(state["data"])))
            return
        if sum(len(v) for v in form.fields.values()) >= _MAX_FIELDS:
            raise InvalidRequest(f"{name}: the form holds more than {_MAX_FIELDS} fields", param=name)
        if state["size"] > _MAX_FIELD_BYTES:
            raise InvalidRequest(f"{name}: a form field holds more than {_MAX_FIELD_BYTES} bytes", param=name)
        try:
            value = b"".join(state["data"]).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"{name}: not UTF-8 text", param=name) from None
        form.fields.setdefault(name, []).append(value)

    parser = MultipartParser(params[b"boundary"], {
        "on_part_begin": on_part_begin, "on_part_data": on_part_data, "on_part_end": on_part_end,
        "on_header_field": on_header_field, "on_header_value": on_header_value, "on_header_end": on_header_end})
    try:
        parser.write(body)
        parser.finalize()
    except InvalidRequest:
        raise
    except Exception as exc:  # noqa: BLE001 - python-multipart's parse errors are its own classes
        raise InvalidRequest(f"the multipart body could not be parsed ({type(exc).__name__})") from None
    return form


def _float(form: Form, name: str, default: float, lo: float, hi: float) -> float:
    raw = form.one(name)
    if raw is None or raw == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        raise InvalidRequest(f"{name}: {raw!r} is not a number", param=name) from None
    if not lo <= v <= hi:
        raise InvalidRequest(f"{name}: {v:g} is outside {lo:g}..{hi:g}", param=name)
    return v


def _bool(form: Form, name: str) -> bool:
    raw = (form.one(name) or "false").strip().lower()
    if raw not in ("true", "false", "1", "0"):
        raise InvalidRequest(f"{name}: {raw!r} is not true or false", param=name)
    return raw in ("true", "1")


@dataclass
class TranscriptionForm:
    file: FormFile
    model: str
    translate: bool
    language: str | None
    prompt: str | None
    response_format: ResponseFormat
    temperature: float
    stream: bool
    max_tokens: int

    @classmethod
    def of(cls, form: Form, translate: bool) -> TranscriptionForm:
        files = [f for f in form.files if f.name == "file"]
        if not files:
            raise InvalidRequest("file: required (the recording, as a form file)", param="file")
        if len(files) > 1 or len(form.files) > 1:
            raise InvalidRequest(f"file: the form holds {len(form.files)} files; send one recording", param="file")
        model = form.one("model")
        if not model:
            raise InvalidRequest("model: required", param="model")
        fmt = form.one("response_format") or "json"
        if fmt not in RESPONSE_FORMATS:
            raise InvalidRequest(f"response_format: {fmt!r} is not one of {', '.join(RESPONSE_FORMATS)}",
                                 param="response_format")
        grains = form.fields.get("timestamp_granularities[]", []) + form.fields.get("timestamp_granularities", [])
        if any(g != "segment" for g in grains):
            raise UnsupportedOption("timestamp_granularities[]: only segment (one per audio window) is supported",
                                    param="timestamp_granularities[]")
        stream = _bool(form, "stream")
        if stream and fmt not in ("json", "text"):
            raise InvalidRequest(f"stream: not with response_format {fmt!r} (json or text)", param="stream")
        max_tokens = int(_float(form, "max_tokens", 448, 1, 4096))
        language = form.one("language") or None
        if language is not None and len(language) > 32:
            raise InvalidRequest("language: at most 32 characters (an ISO-639-1 code such as 'en')", param="language")
        return cls(files[0], model, translate, language, form.one("prompt") or None, cast(ResponseFormat, fmt),
                   _float(form, "temperature", 0.0, 0.0, 2.0), stream, max_tokens)
