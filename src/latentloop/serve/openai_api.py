"""An OpenAI-compatible server for looped LMs, on FastAPI: ``/v1/completions``, ``/v1/chat/completions`` (both
streaming over server-sent events), ``/v1/models``, ``/health``, and vLLM's ``/tokenize``, ``/detokenize`` and
``/tokenizer_info`` (which lm-evaluation-harness's ``local-completions`` model uses as its tokenizer).

Requests decode in one :class:`~latentloop.serve.engine.Engine` batch, each with its own depth and exit. Beyond
OpenAI's fields a request may set ``num_steps`` (core iterations per token), ``exit`` (an exit criterion such as
``"kl:5e-4"`` or ``"gate:0.9"``), ``continuous`` and ``init_scale``, vLLM's ``top_k`` and ``ignore_eos``; its
``usage`` also reports ``mean_depth``, the core iterations per new token. A bad request gets a 400 whose
message is one line.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, ConfigDict, Field

from latentloop.data.tokenizers import Tokenizer
from latentloop.errors import UsageError
from latentloop.models.generation import GenerationConfig
from latentloop.serve.engine import Engine, Finished, Token
from latentloop.serve.engine import Request as EngineRequest
from latentloop.serve.scoring import prompt_logprobs


class _Sampling(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    # latentloop's own: how deep each token thinks
    num_steps: int | None = Field(None, ge=1)
    exit: str | None = None
    continuous: bool = False
    init_scale: float | None = Field(None, ge=0)


class CompletionBody(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    return_tokens_as_token_ids: bool = False  # vLLM's: logprobs name tokens "token_id:ID"


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    add_generation_prompt: bool = True


@dataclass
class Served:
    """What the server serves: the engine, its tokenizer, the name clients ask for, the chat template."""

    engine: Engine
    tokenizer: Tokenizer
    name: str
    chat_template: str | None = None
    init_scale: float = 1.0
    num_steps: int | None = None  # the deployment's depth (None: the model's), where a request sets none
    exit: str | None = (
        None  # the deployment's exit criterion, where a request sets none ("none" turns it off)
    )


class BadRequest(Exception):
    """A request the server refuses with a 400 and this one-line message."""


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    line = " ".join(str(message).split())
    return JSONResponse({"error": {"message": line, "type": kind, "param": None, "code": status}}, status)


def _validation_message(error: RequestValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON"
    return f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg", "invalid request"))


def create_app(served: Served) -> FastAPI:
    """The FastAPI application serving ``served``; its engine starts with the app and drains when it stops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        served.engine.start()
        try:
            yield
        finally:
            await run_in_threadpool(served.engine.close, True)

    app = FastAPI(title="latentloop", lifespan=lifespan)
    tokenizer, engine = served.tokenizer, served.engine
    block_size = engine.model.config.block_size

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        return _error(400, _validation_message(error))

    @app.exception_handler(BadRequest)
    async def bad(_: Request, error: BadRequest) -> JSONResponse:
        return _error(400, str(error))

    @app.exception_handler(UsageError)
    async def usage(_: Request, error: UsageError) -> JSONResponse:
        return _error(400, str(error))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "requests": engine.busy}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": served.name, "object": "model", "created": 0, "owned_by": "latentloop"}
        return {"object": "list", "data": [{**card, "max_model_len": block_size}]}

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        def text(token_id: int | None) -> str | None:
            return None if token_id is None else tokenizer.token_text(token_id)

        return {
            "eos_token": text(tokenizer.eos_id),
            "bos_token": text(tokenizer.bos_id),
            "pad_token": text(tokenizer.pad_id),
            "chat_template": served.chat_template,
            "model_max_length": block_size,
        }

    @app.post("/tokenize")
    async def tokenize(body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string")
        tokens = tokenizer.encode(prompt)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": block_size}

    @app.post("/detokenize")
    async def detokenize(body: dict[str, Any]) -> dict[str, Any]:
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise BadRequest("tokens must be a list of token ids")
        return {"prompt": tokenizer.decode(tokens)}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, raw: Request):
        _check_model(served, body.model)
        prompts = _prompts(tokenizer, body.prompt)
        if body.stream and (body.echo or body.logprobs is not None):
            raise BadRequest("echo and logprobs are served without stream")
        jobs = [_job(served, body, ids, i, body.logprobs) for ids in prompts for i in range(body.n)]
        if body.stream:
            return _stream(served, jobs, raw, "text_completion", body, _text_delta)
        if body.max_tokens == 0:  # scoring the prompt only
            if not body.echo:
                raise BadRequest("max_tokens must be at least 1 unless echo scores the prompt alone")
            results = [("", "length", []) for _ in jobs]
        else:
            results = await _finish_all(served, jobs, raw)
        choices = []
        for index, (job, result) in enumerate(zip(jobs, results, strict=True)):
            text, reason, tokens = result
            choice: dict[str, Any] = {"index": index, "text": text, "finish_reason": reason, "logprobs": None}
            if body.echo:
                choice["text"] = tokenizer.decode(job.request.prompt) + text
            if body.logprobs is not None:
                scored = []
                if body.echo:
                    scored = await run_in_threadpool(
                        prompt_logprobs,
                        engine.model,
                        job.request.prompt,
                        job.depth,
                        job.init_scale,
                        body.logprobs,
                    )
                prompt = job.request.prompt if body.echo else []
                choice["logprobs"] = _logprob_block(
                    tokenizer, prompt, scored, tokens, body.return_tokens_as_token_ids
                )
            choices.append(choice)
        return _response("text_completion", served, choices, jobs, results)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, raw: Request):
        _check_model(served, body.model)
        if served.chat_template is None:
            raise BadRequest(
                f"model {served.name} has no chat template: start the server with --chat-template FILE"
            )
        text = _render_chat(served, body)
        ids = tokenizer.encode(text)
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        jobs = [_job(served, body, ids, i, None) for i in range(body.n)]
        if body.stream:
            return _stream(served, jobs, raw, "chat.completion.chunk", body, _chat_delta)
        results = await _finish_all(served, jobs, raw)
        choices = [
            {
                "index": index,
                "message": {"role": "assistant", "content": text},
                "finish_reason": reason,
                "logprobs": None,
            }
            for index, (text, reason, _) in enumerate(results)
        ]
        return _response("chat.completion", served, choices, jobs, results)

    return app


# Requests ---------------------------------------------------------------------------------------------------


def _check_model(served: Served, model: str | None) -> None:
    if model is not None and model != served.name:
        raise BadRequest(f"unknown model {model!r}: this server serves {served.name!r}")


def _prompts(tokenizer: Tokenizer, prompt: Any) -> list[list[int]]:
    """Token ids of each prompt: a string, a list of strings, a list of ids, or a list of lists of ids."""
    if isinstance(prompt, str):
        prompts = [tokenizer.encode(prompt)]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]
    else:
        prompts = [list(p) if isinstance(p, list) else tokenizer.encode(p) for p in prompt]
    if not prompts or any(not ids for ids in prompts):
        raise BadRequest("the prompt is empty: give at least one token")
    return prompts


@dataclass
class _Job:
    """One choice of one request: what the engine decodes, and how its text ends."""

    request: EngineRequest
    depth: int
    init_scale: float
    stops: list[str]
    events: asyncio.Queue


def _job(served: Served, body: _Sampling, ids: list[int], index: int, logprobs: int | None) -> _Job:
    engine, tokenizer = served.engine, served.tokenizer
    max_tokens = body.max_tokens
    if max_tokens is None:
        max_tokens = engine.model.config.block_size - len(ids)
    if max_tokens == 0:
        max_tokens = 1  # echo-only scoring asks for no new token; one is decoded and not returned
    init_scale = served.init_scale if body.init_scale is None else body.init_scale
    try:
        config = GenerationConfig(
            max_new_tokens=max_tokens,
            num_steps=served.num_steps if body.num_steps is None else body.num_steps,
            init_scale=init_scale,
            do_sample=body.temperature > 0,
            temperature=body.temperature if body.temperature > 0 else 1.0,
            top_k=body.top_k if body.top_k > 0 else None,
            top_p=body.top_p if body.top_p < 1 else None,
            stop_tokens=() if body.ignore_eos else (tokenizer.eos_id,),
            exit=served.exit if body.exit is None else body.exit,
            continuous=body.continuous,
        )
    except UsageError as error:
        raise BadRequest(str(error)) from None
    seed = None if body.seed is None else body.seed + index
    request = EngineRequest(ids, config, seed=seed, logprobs=logprobs)
    depth = engine.check(request)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return _Job(request, depth, init_scale, [s for s in stops if s], asyncio.Queue())


def _submit(served: Served, job: _Job) -> None:
    loop = asyncio.get_running_loop()
    job.request.emit = lambda event: loop.call_soon_threadsafe(job.events.put_nowait, event)
    served.engine.submit(job.request)


class _Text:
    """The text of a job's tokens so far, cut at a stop string; ``ready`` is what may be sent (a character
    still being spelled out in bytes, or text that may begin a stop string, waits)."""

    def __init__(self, tokenizer: Tokenizer, stops: list[str]) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.text = ""
        self.stopped = False

    def add(self, token: int) -> None:
        self.ids.append(token)
        self.text = self.tokenizer.decode(self.ids)
        for stop in self.stops:
            cut = self.text.find(stop)
            if cut >= 0:
                self.text, self.stopped = self.text[:cut], True

    def ready(self, final: bool) -> str:
        if final or self.stopped:
            return self.text
        text = self.text.rstrip("\ufffd")
        hold = max((len(s) - 1 for s in self.stops), default=0)
        return text[: len(text) - hold] if hold else text


async def _events(job: _Job, raw: Request) -> AsyncIterator[Token | Finished]:
    """The job's events; cancels it if the client goes away."""
    while True:
        try:
            event = await asyncio.wait_for(job.events.get(), timeout=0.5)
        except asyncio.TimeoutError:
            if await raw.is_disconnected():
                job.request.cancel()
                return
            continue
        yield event
        if isinstance(event, Finished):
            return


async def _finish(served: Served, job: _Job, raw: Request) -> tuple[str, str, list[Token]]:
    """Runs a job to its end: its text, finish reason and tokens."""
    text, tokens = _Text(served.tokenizer, job.stops), []
    reason = "cancelled"
    async for event in _events(job, raw):
        if isinstance(event, Token):
            text.add(event.id)
            tokens.append(event)
            if text.stopped:
                job.request.cancel()
                reason = "stop"
                break
        else:
            if event.reason == "error":
                raise RuntimeError(event.message)
            reason = event.reason
    return text.ready(final=True), reason, tokens


async def _finish_all(served: Served, jobs: list[_Job], raw: Request) -> list[tuple[str, str, list[Token]]]:
    for job in jobs:
        _submit(served, job)
    try:
        return list(await asyncio.gather(*(_finish(served, job, raw) for job in jobs)))
    finally:
        for job in jobs:
            job.request.cancel()


def _stream(
    served: Served,
    jobs: list[_Job],
    raw: Request,
    kind: str,
    body: _Sampling,
    delta: Callable[[str, bool], dict[str, Any]],
) -> StreamingResponse:
    """Server-sent events: one chunk per piece of new text, a last chunk per choice with its finish reason,
    a usage chunk where ``stream_options.include_usage`` asks for one, then ``[DONE]``."""
    for job in jobs:
        _submit(served, job)
    ident, created = _ident(kind), int(time.time())

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        data = {"id": ident, "object": kind, "created": created, "model": served.name, "choices": choices}
        if usage is not None:
            data["usage"] = usage
        return f"data: {json.dumps(data)}\n\n"

    async def events() -> AsyncIterator[str]:
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, job: _Job) -> None:
            async for event in _events(job, raw):
                await merged.put((index, event))
            await merged.put((index, None))

        pumps = [asyncio.create_task(pump(i, job)) for i, job in enumerate(jobs)]
        texts = [_Text(served.tokenizer, job.stops) for job in jobs]
        sent = [0] * len(jobs)
        tokens: list[list[Token]] = [[] for _ in jobs]
        open_jobs, first = len(jobs), [True] * len(jobs)
        try:
            while open_jobs:
                index, event = await merged.get()
                if event is None:
                    open_jobs -= 1
                    continue
                text = texts[index]
                if isinstance(event, Token):
                    if text.stopped:
                        continue
                    text.add(event.id)
                    tokens[index].append(event)
                    if text.stopped:
                        jobs[index].request.cancel()
                    ready = text.ready(final=False)
                    if len(ready) > sent[index] or first[index]:
                        piece = {"index": index, **delta(ready[sent[index] :], first[index])}
                        yield chunk([{**piece, "finish_reason": None, "logprobs": None}])
                        sent[index], first[index] = len(ready), False
                    continue
                if event.reason == "error":
                    yield f"data: {json.dumps({'error': {'message': event.message, 'code': 500}})}\n\n"
                    return
                ready = text.ready(final=True)
                reason = "stop" if text.stopped else event.reason
                piece = {"index": index, **delta(ready[sent[index] :], first[index])}
                yield chunk([{**piece, "finish_reason": reason, "logprobs": None}])
                sent[index] = len(ready)
            if (body.stream_options or {}).get("include_usage"):
                results = [(t.text, "", tok) for t, tok in zip(texts, tokens, strict=True)]
                yield chunk([], _usage(jobs, results))
            yield "data: [DONE]\n\n"
        finally:
            for task in pumps:
                task.cancel()
            for job in jobs:
                job.request.cancel()

    return StreamingResponse(events(), media_type="text/event-stream")


def _text_delta(text: str, first: bool) -> dict[str, Any]:
    return {"text": text}


def _chat_delta(text: str, first: bool) -> dict[str, Any]:
    return {"delta": {"role": "assistant", "content": text} if first else {"content": text}}


def _ident(kind: str) -> str:
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return f"{prefix}-{uuid.uuid4().hex}"


def _usage(jobs: list[_Job], results: list[tuple[str, str, list[Token]]]) -> dict[str, Any]:
    prompt = sum(len(job.request.prompt) for job in jobs)
    completion = sum(len(tokens) for _, _, tokens in results)
    steps = sum(token.steps for _, _, tokens in results for token in tokens)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "mean_depth": round(steps / completion, 4) if completion else 0.0,
    }


def _response(
    kind: str,
    served: Served,
    choices: list[dict[str, Any]],
    jobs: list[_Job],
    results: list[tuple[str, str, list[Token]]],
) -> dict[str, Any]:
    return {
        "id": _ident(kind),
        "object": kind,
        "created": int(time.time()),
        "model": served.name,
        "choices": choices,
        "usage": _usage(jobs, results),
    }


def _logprob_block(
    tokenizer: Tokenizer,
    prompt: list[int],
    scored: list[tuple[float | None, tuple[tuple[int, float], ...]]],
    tokens: list[Token],
    as_ids: bool = False,
) -> dict[str, Any]:
    """OpenAI's legacy completion logprobs: per token its text (``token_id:ID`` with ``as_ids``),
    log-probability, top alternatives and offset (the prompt's tokens first where echoed; its first token has no
    log-probability)."""

    def name(token_id: int) -> str:
        return f"token_id:{token_id}" if as_ids else tokenizer.token_text(token_id)

    entries = list(zip(prompt, scored, strict=True)) + [(t.id, (t.logprob, t.top)) for t in tokens]
    block: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for token_id, (logprob, top) in entries:
        text = tokenizer.token_text(token_id)
        block["tokens"].append(name(token_id))
        block["token_logprobs"].append(logprob)
        alternatives: dict[str, float] = {}
        for other, value in top:
            alternatives.setdefault(name(other), value)
        block["top_logprobs"].append(alternatives if logprob is not None else None)
        block["text_offset"].append(offset)
        offset += len(text)
    return block


def _render_chat(served: Served, body: ChatBody) -> str:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise BadRequest(message)

    environment.globals["raise_exception"] = raise_exception
    tokenizer = served.tokenizer
    messages = [message.model_dump(exclude_none=True) for message in body.messages]
    for message in messages:
        if isinstance(message.get("content"), list):  # content parts: the text ones, joined
            message["content"] = "".join(part.get("text", "") for part in message["content"])
    try:
        return environment.from_string(served.chat_template).render(
            messages=messages,
            add_generation_prompt=body.add_generation_prompt,
            bos_token=tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else "",
            eos_token=tokenizer.token_text(tokenizer.eos_id),
        )
    except BadRequest:
        raise
    except Exception as error:  # a template error is the request's (roles it does not accept) or the file's
        raise BadRequest(f"the chat template failed: {error}") from None
