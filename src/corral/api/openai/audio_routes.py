"""OpenAI's speech-to-text routes: ``POST /v1/audio/transcriptions`` and
``/v1/audio/translations`` (also without ``/v1``, as llama-server has the first).

The form (api/openai/audio_form.py) is checked, the model must hear (400
``audio_not_supported`` otherwise), and the file is decoded in a child process to 16 kHz
mono PCM (api/core/audio.py, with its bounds). A recording longer than a window (30 s) is
cut into windows, each on a quiet place near its end; every window is one worker request
(a chat turn: the instruction, then the window's audio, as llama-server asks), all submitted at once, so they
run side by side on the model's free slots and instances, and the text is joined in
order. A reasoning model transcribes with its reasoning off (``think = false``).

Answers: ``json`` (``text`` and ``usage`` in OpenAI's token shape), ``text``, ``srt``,
``vtt`` and ``verbose_json`` (one segment per window with its start and end). ``stream``
sends ``transcript.text.delta`` events in order (a later window's text waits for the
earlier ones) and one ``transcript.text.done`` with the whole text and the usage.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import wire
from corral.api.core.audio import RATE, Pcm, AudioBudget, decode_audio, wav_bytes, windows
from corral.api.core.generation import FinishEvent, GenerationSpec, TextEvent, generate, open_stream, target_of
from corral.api.http import InTaskStreamingResponse, json_response, plane_of, sse_data
from corral.api.openai.audio_form import TranscriptionForm, parse_form
from corral.control.capabilities import can
from corral.errors import AudioNotSupported, CorralError

__all__ = ["router", "instruction", "srt", "vtt"]

router = APIRouter()


def instruction(form: TranscriptionForm) -> str:
    """What each window's turn asks of the model, before its audio. A transcription asks what
    llama-server asks (tools/server's ``convert_transcriptions_to_chatcmpl`` with
    ``common_chat_get_asr_prompt``): "Transcribe audio to text", `` (language: xx)`` where one
    is given, the audio right after it in one user turn, so both servers give a model the
    same prompt. Two things are corral's own: translations (llama-server has no such route)
    and ``prompt``, which OpenAI defines as context for the transcript (names, terms, the
    text before) and corral adds to the instruction, where llama-server would put it in the
    instruction's place."""
    if form.translate:
        text = "Translate audio to English text"
    else:
        text = "Transcribe audio to text" + (f" (language: {form.language})" if form.language else "")
    if form.prompt:
        text += f". Context (spelling of names and terms): {form.prompt}"
    return text


def _stamp(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(segments: list[dict[str, Any]]) -> str:
    return "".join(f"{i + 1}\n{_stamp(s['start'], ',')} --> {_stamp(s['end'], ',')}\n{s['text'].strip()}\n\n"
                   for i, s in enumerate(segments))


def vtt(segments: list[dict[str, Any]]) -> str:
    return "WEBVTT\n\n" + "".join(f"{_stamp(s['start'], '.')} --> {_stamp(s['end'], '.')}\n{s['text'].strip()}\n\n"
                                  for s in segments)


def _usage(u: wire.Usage | None) -> dict[str, Any]:
    p, c = (u.prompt_tokens, u.completion_tokens) if u else (0, 0)
    return {"type": "tokens", "input_tokens": p, "output_tokens": c, "total_tokens": p + c}


async def _spec(request: Request, form: TranscriptionForm) -> tuple[GenerationSpec, Pcm, list[tuple[int, int]]]:
    """The windows of the form's recording as worker requests (one each)."""
    endpoint = "translations" if form.translate else "transcriptions"
    rid = "trsc-" + secrets.token_hex(12)
    spec = GenerationSpec(form.model, endpoint, rid, [])
    target = target_of(request, spec)
    if target.implied:
        raise AudioNotSupported(f"model: {form.model!r} is an adapter model; send audio to its base model",
                                param="model")
    if not can(target.pool, "audio"):
        raise AudioNotSupported(
            f"model: {target.pool.spec.id!r} does not hear audio: it has no projector with an audio encoder "
            "(set mmproj in its [models] table to one, e.g. Qwen2-Audio's or Ultravox's)", param="model")
    srv = plane_of(request).config.server
    pcm = await decode_audio(form.file.data, "file", srv, AudioBudget.of(srv), _declared(form.file.filename))
    cuts = windows(pcm)
    ask = instruction(form)
    params = wire.SamplingParams(temperature=form.temperature, max_tokens=form.max_tokens)
    for i, (a, b) in enumerate(cuts):
        turn = wire.ChatMessage("user", ask + wire.MEDIA_MARKER, images=[wav_bytes(Pcm(pcm.samples[a:b]))])
        spec.requests.append(wire.GenerateRequest(id=f"{rid}-{i}", messages=[turn], params=params, think=False,
                                                  thinking_optional=True, media_group=rid))
    return spec, pcm, cuts


def _declared(filename: str) -> str | None:
    """A file name's extension as its declared format (None: none or one we do not know)."""
    from corral.api.core.audio import FORMATS

    ext = filename.rpartition(".")[2].lower() if "." in filename else ""
    return ext if ext in FORMATS else None


@router.post("/v1/audio/transcriptions")
@router.post("/audio/transcriptions", include_in_schema=False)
async def transcriptions(request: Request) -> Response:
    return await _answer(request, translate=False)


@router.post("/v1/audio/translations")
@router.post("/audio/translations", include_in_schema=False)
async def translations(request: Request) -> Response:
    return await _answer(request, translate=True)


async def _answer(request: Request, *, translate: bool) -> Response:
    srv = plane_of(request).config.server
    form = TranscriptionForm.of(parse_form(await request.body(), request.headers.get("content-type", ""),
                                           srv.max_audio_files_per_request), translate)
    spec, pcm, cuts = await _spec(request, form)
    if form.stream:
        return await _streamed(request, spec, form)
    r = await generate(request, spec)
    texts = [c.text.strip() for c in r.choices]
    text = " ".join(t for t in texts if t)
    segments = [{"id": i, "seek": a * 100 // RATE, "start": a / RATE, "end": b / RATE, "text": t, "tokens": [],
                 "temperature": form.temperature, "avg_logprob": 0.0, "compression_ratio": 0.0, "no_speech_prob": 0.0}
                for i, ((a, b), t) in enumerate(zip(cuts, texts))]
    if form.response_format == "text":
        return Response(text + "\n", media_type="text/plain; charset=utf-8")
    if form.response_format == "srt":
        return Response(srt(segments), media_type="text/plain; charset=utf-8")
    if form.response_format == "vtt":
        return Response(vtt(segments), media_type="text/vtt; charset=utf-8")
    if form.response_format == "verbose_json":
        return json_response({"task": "translate" if translate else "transcribe",
                              "language": "english" if translate else (form.language or ""),
                              "duration": pcm.seconds, "text": text, "segments": segments,
                              "usage": {"type": "duration", "seconds": int(-(-pcm.seconds // 1))}})
    return json_response({"text": text, "usage": _usage(r.usage)})


async def _streamed(request: Request, spec: GenerationSpec, form: TranscriptionForm) -> Response:
    gs = await open_stream(request, spec)
    n = len(gs.streams)

    async def events() -> AsyncIterator[bytes]:
        held: list[list[str]] = [[] for _ in range(n)]
        done = [False] * n
        started = [False] * n
        at = 0  # the window whose text is sent as it comes; later ones are held until it ends
        joined = ""

        def emit(i: int, text: str) -> bytes | None:
            nonlocal joined
            if not started[i]:
                text = text.lstrip()
                if not text:
                    return None
                text = (" " + text) if joined else text
                started[i] = True
            joined += text
            return sse_data({"type": "transcript.text.delta", "delta": text, "logprobs": None})

        try:
            async for ev in gs.events():
                out: list[bytes | None] = []
                if type(ev) is TextEvent and ev.text:
                    if ev.index == at:
                        out.append(emit(at, ev.text))
                    else:
                        held[ev.index].append(ev.text)
                elif type(ev) is FinishEvent:
                    done[ev.index] = True
                    while at < n and done[at]:
                        at += 1
                        if at < n:
                            out += [emit(at, t) for t in held[at]]
                            held[at] = []
                for chunk in out:
                    if chunk is not None:
                        yield chunk
        except CorralError as exc:
            yield sse_data(exc.to_body())
            return
        yield sse_data({"type": "transcript.text.done", "text": joined.strip(), "logprobs": None, "usage": _usage(gs.usage)})
        yield b"data: [DONE]\n\n"

    return InTaskStreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
