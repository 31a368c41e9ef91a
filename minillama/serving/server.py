"""An OpenAI-compatible HTTP server on the continuous-batching engine: `python -m minillama serve` (chapter 12).

Every server of open models (vLLM, SGLang, llama.cpp's server, Ollama) speaks OpenAI's API, so one
client library talks to all of them. This one is small and has three parts:

- the engine thread (`EngineLoop`): one background thread owns the `Engine` (which is not
  thread-safe) and calls `step()` while any request has work; requests come in through a thread-safe
  queue, tokens go out to each request's own `asyncio.Queue` via `loop.call_soon_threadsafe`, so the
  event loop never waits on the model and the model never waits on a slow client;
- the HTTP side (Starlette on uvicorn): `GET /health`, `GET /v1/models`, `POST /v1/completions`,
  `POST /v1/chat/completions`, each streaming server-sent events (`data: {...}`, then `data: [DONE]`)
  when asked; the bodies are checked strictly (`openai_schema.py`) and every failure is OpenAI's
  error object with a 4xx status;
- the text: tokens decode to whole UTF-8 characters only, `stop` strings are matched on the decoded
  text (held back until they can no longer start a match, and never returned), and a client that
  disconnects aborts its request, whose KV-cache blocks the engine frees at once.

Nothing in a request reaches the filesystem: the body is read into memory (at most `max_body_bytes`,
past which the answer is 413) and the model name is compared, never used as a path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import secrets
import sys
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator

try:
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route
except ImportError as error:  # the extra is not installed
    raise ImportError(
        f"the server needs Starlette and uvicorn: pip install 'minillama[serve]' ({error})"
    ) from None

from ..tokenizer import StreamDecoder
from . import SamplingParams  # the engine's parameters (minillama.serving re-exports them)
from .openai_schema import APIError, ChatCompletionRequest, CompletionRequest, parse

MAX_BODY_BYTES = 4 * 2**20  # a full 128k-token prompt as text or as ids fits well within this
DRAIN_BYTES = 64 * 2**20  # an oversized body is read (and dropped) up to this, so the client sees its 413


class _Stream:
    """One request as the HTTP side sees it: its engine id and the queue its events arrive on."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.request_id: int | None = None

    def send(self, event: tuple) -> None:  # called from the engine thread
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed: the server is gone, nobody is listening
            pass


class EngineLoop:
    """The one thread that owns the engine: it adds and aborts requests from its inbox and steps the
    engine while there is work, handing each new token to its request's stream.

    Events a stream receives: ("accepted", request_id), then ("token", token, finished, finish_reason)
    for each step's output; or ("error", status, message) instead.
    """

    def __init__(self, engine, idle_wait: float = 0.5):
        self.engine = engine
        self.idle_wait = idle_wait
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[int, _Stream] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.error: str | None = None  # set when a step raised: the engine is then out of service
        self.snapshot: dict = {}
        self._publish()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="minillama-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._inbox.put(None)  # wake the thread if it waits for work
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, prompt_ids: list[int], params, loop: asyncio.AbstractEventLoop) -> _Stream:
        stream = _Stream(loop)
        self._inbox.put(("add", stream, prompt_ids, params))
        return stream

    def abort(self, stream: _Stream) -> None:
        self._inbox.put(("abort", stream))

    # the engine thread from here on
    def _run(self) -> None:
        while not self._stopping.is_set():
            self._take_inbox(wait=not self.engine.has_unfinished())
            if self.error is None and self.engine.has_unfinished():
                try:
                    outputs = self.engine.step()
                except Exception:  # the engine is broken: every request gets a 500, /health says why
                    self._fail(traceback.format_exc())
                    continue
                self.steps += 1
                sends = []
                for out in outputs:
                    stream = self._streams.get(out.request_id)
                    if stream is not None:
                        sends.append((stream, ("token", out.token, out.finished, out.finish_reason)))
                        if out.finished:
                            del self._streams[out.request_id]
                self._publish()  # before the tokens go out: a client that has seen its end sees it in /health
                for stream, event in sends:
                    stream.send(event)
            else:
                self._publish()
        for stream in self._streams.values():
            stream.send(("error", 503, "the server is shutting down"))

    def _take_inbox(self, wait: bool) -> None:
        try:
            item = self._inbox.get(timeout=self.idle_wait) if wait else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            self._handle(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, item: tuple) -> None:
        if item[0] == "add":
            _, stream, prompt_ids, params = item
            if self.error is not None:
                stream.send(("error", 503, f"the engine failed and is out of service: {self.error}"))
                return
            try:
                request_id = self.engine.add_request(prompt_ids, params)
            except ValueError as error:  # the prompt does not fit, or a bad setting: the client's fault
                stream.send(("error", 400, str(error)))
                return
            stream.request_id = request_id
            self._streams[request_id] = stream
            stream.send(("accepted", request_id))
        else:  # abort: frees the request's blocks now, not when it would have finished
            stream = item[1]
            if stream.request_id is not None and self._streams.pop(stream.request_id, None) is not None:
                self.engine.abort(stream.request_id)

    def _fail(self, trace: str) -> None:
        print(trace, file=sys.stderr, flush=True)
        self.error = trace.strip().splitlines()[-1]
        for request_id, stream in list(self._streams.items()):
            stream.send(("error", 500, f"the engine failed: {self.error}"))
            try:
                self.engine.abort(request_id)
            except Exception:
                pass
        self._streams.clear()

    def _publish(self) -> None:
        engine = self.engine
        # one dict, replaced whole: the HTTP side reads it without a lock (the engine is not thread-safe)
        self.snapshot = {
            "steps": self.steps,
            "requests": len(self._streams),
            "free_blocks": engine.free_blocks,
            "num_blocks": engine.num_blocks,
            "block_size": engine.block_size,
            "engine": dict(engine.stats()),
        }


class _Text:
    """Tokens -> the text a client is sent: whole UTF-8 characters only, cut before the first `stop`
    string (which is never sent), holding back the tail that could still be the start of one."""

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False  # a stop string was found
        self._decoder = StreamDecoder(tokenizer)

    def push(self, token: int) -> str:
        self.text += self._decoder.push(token)
        return self._release(final=False)

    def finish(self) -> str:
        self.text += self._decoder.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        hits = [i for s in self.stops if (i := self.text.find(s, self.sent)) >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = final = True
        end = len(self.text) if final else max(self.sent, len(self.text) - self.hold)
        piece = self.text[self.sent : end]
        self.sent = end
        return piece


class Server:
    """The HTTP application around an engine: `Server(engine, tokenizer, "name").app` is an ASGI app."""

    def __init__(self, engine, tokenizer, model_name: str, *, max_body_bytes: int = MAX_BODY_BYTES):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_body_bytes = max_body_bytes
        self.max_seq_len = engine.max_seq_len
        self.created = int(time.time())
        self._stop_tokens = tuple(getattr(tokenizer, "stop_tokens", ()))
        self._vocab = getattr(tokenizer, "vocab_size", None)
        self.loop = EngineLoop(engine)
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            ],
            exception_handlers={
                APIError: self._api_error,
                HTTPException: self._http_error,
                Exception: self._internal_error,
            },
            lifespan=self._lifespan,
        )

    # lifecycle
    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        self.loop.start()
        try:
            yield
        finally:
            self.loop.stop()

    # errors as OpenAI's error object
    async def _api_error(self, request, error: APIError):
        return JSONResponse(error.body(), status_code=error.status)

    async def _http_error(self, request, error):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(
            error.status_code, "invalid_request_error"
        )
        message = {
            404: f"no route {request.url.path!r}; this server has GET /health, GET /v1/models, "
            "POST /v1/completions, POST /v1/chat/completions",
            405: f"{request.method} is not allowed on {request.url.path!r}",
        }.get(error.status_code, str(error.detail))
        body = APIError(error.status_code, message, type=kind).body()
        return JSONResponse(body, status_code=error.status_code, headers=getattr(error, "headers", None))

    async def _internal_error(self, request, error):
        traceback.print_exception(error, file=sys.stderr)
        body = APIError(500, f"internal error: {type(error).__name__}", type="server_error").body()
        return JSONResponse(body, status_code=500)

    # endpoints
    async def health(self, request):
        ok = self.loop.error is None
        body = {"status": "ok" if ok else "error", "model": self.model_name, **self.loop.snapshot}
        if not ok:
            body["error"] = self.loop.error
        return JSONResponse(body, status_code=200 if ok else 503)

    async def models(self, request):
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "minillama",
            "max_model_len": self.max_seq_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(self, request):
        req = parse(CompletionRequest, await self._json(request))
        self._check_model(req.model)
        if isinstance(req.prompt, str):
            prompt_ids = self.tokenizer.encode(req.prompt, bos=True)
        else:
            prompt_ids = list(req.prompt)
            if self._vocab is not None and max(prompt_ids) >= self._vocab:
                raise APIError(
                    400,
                    f"prompt holds token id {max(prompt_ids)}, outside the vocabulary 0..{self._vocab - 1}",
                    param="prompt",
                )
        return await self._respond(request, req, prompt_ids, chat=False)

    async def chat_completions(self, request):
        req = parse(ChatCompletionRequest, await self._json(request))
        self._check_model(req.model)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        prompt_ids = self.tokenizer.encode_dialog(messages)
        return await self._respond(request, req, prompt_ids, chat=True)

    # the shared path
    async def _json(self, request) -> object:
        limit = self.max_body_bytes
        declared = request.headers.get("content-length", "")
        too_large = APIError(
            413,
            f"the request body is larger than {limit:,} bytes, this server's limit; send a shorter prompt",
            code="request_too_large",
        )
        body = bytearray()
        dropped = 0
        try:
            async for chunk in request.stream():
                if (
                    dropped
                    or len(body) + len(chunk) > limit
                    or (declared.isdigit() and int(declared) > limit)
                ):
                    dropped += len(chunk)  # keep reading (and dropping) so the client gets to read its 413
                    if dropped > DRAIN_BYTES:
                        break
                    continue
                body += chunk
        except ClientDisconnect:  # nobody will read the answer; no traceback for it either
            raise APIError(400, "the client disconnected while sending the request body") from None
        if dropped or (declared.isdigit() and int(declared) > limit):
            raise too_large
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise APIError(400, f"the request body is not valid JSON: {error}", code="invalid_json") from None

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(
                404,
                f"the model {name!r} does not exist; this server serves {self.model_name!r} (GET /v1/models)",
                type="invalid_request_error",
                param="model",
                code="model_not_found",
            )

    def _sampling(self, req, prompt_len: int):
        limit = self.max_seq_len
        if prompt_len >= limit:
            raise APIError(
                400,
                f"this model's maximum context length is {limit} tokens, and the prompt has {prompt_len}; "
                f"shorten the prompt to at most {limit - 1} tokens",
                param="messages" if isinstance(req, ChatCompletionRequest) else "prompt",
                code="context_length_exceeded",
            )
        max_tokens = req.max_tokens if req.max_tokens is not None else limit - prompt_len
        if prompt_len + max_tokens > limit:
            raise APIError(
                400,
                f"this model's maximum context length is {limit} tokens; a prompt of {prompt_len} "
                f"token{'s' if prompt_len != 1 else ''} + max_tokens {max_tokens} needs {prompt_len + max_tokens}; "
                f"lower max_tokens to at most {limit - prompt_len} or shorten the prompt",
                param="max_tokens",
                code="context_length_exceeded",
            )
        # without a seed each sampled request draws its own (OpenAI's behaviour); greedy needs none
        seed = req.seed if req.seed is not None else secrets.randbelow(2**31)
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                seed=seed,
                stop_tokens=self._stop_tokens,
            )
        except ValueError as error:
            raise APIError(400, str(error)) from None

    async def _respond(self, request, req, prompt_ids: list[int], chat: bool):
        params = self._sampling(req, len(prompt_ids))
        stream = await self._submit(prompt_ids, params)
        kind = "chatcmpl" if chat else "cmpl"
        meta = {"id": f"{kind}-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.model_name}
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": 0, "total_tokens": len(prompt_ids)}
        text = _Text(self.tokenizer, req.stop_strings())
        pieces = self._pieces(stream, text, usage, None if req.stream else request)
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            events = self._sse(pieces, meta, usage, chat, include_usage)
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        parts, reason = [], None
        async for piece, finish in pieces:
            parts.append(piece)
            reason = finish or reason
        out = "".join(parts)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": out}, "finish_reason": reason}
            body = {**meta, "object": "chat.completion", "choices": [choice], "usage": usage}
        else:
            choice = {"index": 0, "text": out, "logprobs": None, "finish_reason": reason}
            body = {**meta, "object": "text_completion", "choices": [choice], "usage": usage}
        return JSONResponse(body)

    async def _submit(self, prompt_ids: list[int], params) -> _Stream:
        if self.loop.error is not None:
            raise APIError(
                503, f"the engine failed and is out of service: {self.loop.error}", type="server_error"
            )
        stream = self.loop.submit(prompt_ids, params, asyncio.get_running_loop())
        try:
            event = await stream.events.get()
        except asyncio.CancelledError:
            self.loop.abort(stream)
            raise
        if event[0] == "error":
            raise APIError(
                event[1], event[2], type="server_error" if event[1] >= 500 else "invalid_request_error"
            )
        return stream

    async def _pieces(
        self, stream: _Stream, text: _Text, usage: dict, request
    ) -> AsyncIterator[tuple[str, str | None]]:
        """(text, finish_reason or None) as the tokens arrive; aborts the request when the client goes
        away, when a stop string ends the text, or when anything else ends this generator early."""
        finished = False
        # no stream to write to, so nothing notices a client that has gone: a task listens for it
        watcher = asyncio.create_task(self._watch(request, stream)) if request is not None else None
        try:
            while True:
                event = await stream.events.get()
                if event[0] == "gone":
                    return
                if event[0] == "error":
                    finished = True
                    raise APIError(event[1], event[2], type="server_error")
                _, token, done, reason = event
                if token is not None:
                    usage["completion_tokens"] += 1
                    usage["total_tokens"] += 1
                    if token not in self._stop_tokens:
                        piece = text.push(token)
                        if text.stopped:
                            yield piece + text.finish(), "stop"
                            return
                        if piece:
                            yield piece, None
                if done:
                    finished = True
                    rest = text.finish()
                    yield rest, "stop" if text.stopped else _finish_reason(reason)
                    return
        finally:
            if watcher is not None:
                watcher.cancel()
            if not finished:  # a stop string, a disconnect or a cancelled task: free the blocks now
                self.loop.abort(stream)

    @staticmethod
    async def _watch(request, stream: _Stream) -> None:
        """Wait for the client of a non-streamed request to disconnect (its body has been read, so the
        next ASGI message is the disconnect), then tell the request's reader."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        stream.events.put_nowait(("gone",))

    async def _sse(self, pieces, meta: dict, usage: dict, chat: bool, include_usage: bool):
        def event(choice: dict, **extra) -> str:
            obj = "chat.completion.chunk" if chat else "text_completion"
            body = {**meta, "object": obj, "choices": [choice] if choice else [], **extra}
            if include_usage and "usage" not in extra:
                body["usage"] = None
            return f"data: {json.dumps(body)}\n\n"

        def choice(piece: str, reason: str | None, first: bool = False) -> dict:
            if chat:
                delta = (
                    {"role": "assistant", "content": piece}
                    if first
                    else ({"content": piece} if piece else {})
                )
                return {"index": 0, "delta": delta, "finish_reason": reason}
            return {"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}

        try:
            if chat:  # OpenAI opens a chat stream with the role
                yield event(choice("", None, first=True))
            async for piece, reason in pieces:
                if piece or reason:
                    yield event(choice(piece, reason))
            if include_usage:
                yield event({}, usage=usage)
        except APIError as error:  # the status line has gone out: the error travels as an event
            yield f"data: {json.dumps(error.body())}\n\n"
        finally:
            await pieces.aclose()
        yield "data: [DONE]\n\n"


def _finish_reason(reason: str | None) -> str:
    return reason if reason in ("stop", "length") else (reason or "stop")


def serve(
    engine,
    tokenizer,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
) -> None:
    """Run the server until interrupted (Ctrl-C or SIGTERM)."""
    import uvicorn

    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"listening on {host}: anyone who can reach this machine on port {port} can use the model "
            "(there is no authentication)",
            file=sys.stderr,
        )
    server = Server(engine, tokenizer, model_name)
    config = uvicorn.Config(
        server.app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5, lifespan="on"
    )
    uvicorn.Server(config).run()
