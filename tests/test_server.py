"""The OpenAI-compatible server (`minillama/serving/server.py`, `python -m minillama serve`), tested over
real HTTP on 127.0.0.1 with the `openai` client and with plain httpx: greedy text equal to `ml.generate`'s
under 40 concurrent streams, no request lost, every KV-cache block back in the pool; a client that
disconnects frees its blocks while the others go on; a full pool queues; every bad input a 4xx with
OpenAI's error object and the server still serving; nothing listens beyond 127.0.0.1 by default.

Every wait is bounded (client timeouts, `_until`), and every server is stopped by its fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import uvicorn

import minillama as ml
from minillama.model import random_model
from minillama.serving import Engine
from minillama.serving.server import Server

ROOT = Path(__file__).resolve().parent.parent
# the tiny shape made smaller still (the 128,256-row output head dominates a step); 256: the context limit
ARGS = ml.MODELS["tiny"].replace(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=32, max_seq_len=256)
NAME = "tiny-test"
TIMEOUT = 60  # seconds: the most any one request of these tests may take on a busy 2-core machine


@contextlib.contextmanager
def running(engine, tokenizer, name=NAME):
    """The server in this process on a free 127.0.0.1 port (bound here, so no other process can take
    it between choosing and listening); stopped, and its threads joined, on exit."""
    server = Server(engine, tokenizer, name)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(server.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    web = uvicorn.Server(config)
    thread = threading.Thread(target=web.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _until(lambda: web.started, 30, "the server did not start")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        web.should_exit = True
        thread.join(15)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"
        assert not server.loop._thread.is_alive(), "the engine thread did not stop"


def _until(condition, timeout: float, message: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} within {timeout} s")
        time.sleep(0.02)
    return value


@pytest.fixture(scope="module")
def tok():
    return ml.Tokenizer.default()


@pytest.fixture(scope="module")
def reference():
    """A second copy of the served weights (the same seed), for `ml.generate`'s answers: the server's
    own model belongs to its engine thread."""
    return random_model(ARGS, seed=0)


@pytest.fixture(scope="module")
def server(tok):
    engine = Engine(random_model(ARGS, seed=0), tok, max_batch=32)
    with running(engine, tok) as (url, srv):
        yield url, srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server[0], timeout=TIMEOUT) as client:
        yield client


def greedy(reference, tok, prompts: list[list[int]], max_tokens: int) -> list[str]:
    """What `ml.generate` gives each prompt, as text (stopping at the tokenizer's stop tokens)."""
    out = ml.generate(reference, prompts, max_new_tokens=max_tokens, stop_tokens=tok.stop_tokens)
    return [tok.decode(ids) for ids in out]


@contextlib.contextmanager
def slow_steps(engine, seconds: float = 0.01):
    """Every engine step takes at least `seconds` longer: a slower model, so that a request abandoned
    early is still far from done when its client goes, on any machine."""
    step = engine.step

    def slower():
        time.sleep(seconds)
        return step()

    engine.step = slower
    try:
        yield
    finally:
        del engine.step  # the class's method again


def idle(http, server) -> dict:
    """/health once every request has left the engine: the pool must be whole again."""
    num_blocks = server[1].engine.num_blocks
    return _until(
        lambda: (h := http.get("/health").json())["requests"] == 0 and h["free_blocks"] == num_blocks and h,
        TIMEOUT,
        "the engine did not return every block to the pool",
    )


def test_health_and_models(http, server):
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["model"] == NAME
    assert health["free_blocks"] == health["num_blocks"] == server[1].engine.num_blocks > 0
    models = http.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [NAME]
    assert models["data"][0]["max_model_len"] == ARGS.max_seq_len


def test_greedy_completion_and_chat_equal_generate(server, http, tok, reference):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    prompt = "The capital of France is"
    ids = tok.encode(prompt, bos=True)
    [want] = greedy(reference, tok, [ids], 12)
    got = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0)
    assert got.choices[0].text == want
    assert got.choices[0].finish_reason == "length"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), 12)
    # token ids as the prompt, over plain HTTP, and the same text
    body = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 12, "temperature": 0}).json()
    assert body["choices"][0]["text"] == want and body["object"] == "text_completion"

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    chat_ids = tok.encode_dialog(messages)
    [want_chat] = greedy(reference, tok, [chat_ids], 10)
    reply = client.chat.completions.create(model=NAME, messages=messages, max_tokens=10, temperature=0)
    assert reply.choices[0].message.content == want_chat
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage.prompt_tokens == len(chat_ids)
    # streamed: the pieces join to the same text, the role comes first, the usage last
    stream = client.chat.completions.create(
        model=NAME,
        messages=messages,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want_chat
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10


def _sse_text(response: httpx.Response, chat: bool) -> tuple[str, str | None, int]:
    """(text, finish_reason, number of data events) of an SSE response that must end with [DONE]."""
    text, reason, events, done = [], None, 0, False
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        assert not done, "data after [DONE]"
        if line == "data: [DONE]":
            done = True
            continue
        events += 1
        choice = json.loads(line[6:])["choices"][0]
        text.append((choice["delta"].get("content") or "") if chat else choice["text"])
        reason = choice["finish_reason"] or reason
    assert done, "the stream did not end with data: [DONE]"
    return "".join(text), reason, events


def test_40_concurrent_streaming_clients_get_their_greedy_text(server, http, tok, reference):
    """40 clients at once (the engine batches at most 32): 24 through the openai client's streaming
    completions, 16 as plain-HTTP streaming chats; each gets exactly what it gets alone."""
    url, srv = server
    words = "the a llama runs on one GPU while many small models decode text quickly".split()
    prompts = [" ".join(words[i % 7 : i % 7 + 2 + i % 9]) for i in range(24)]
    chats = [[{"role": "user", "content": f"Count to {i}, {words[i % 13]}."}] for i in range(16)]
    max_tokens = 16
    want = greedy(reference, tok, [tok.encode(p, bos=True) for p in prompts], max_tokens)
    want_chat = greedy(reference, tok, [tok.encode_dialog(m) for m in chats], max_tokens)
    peak = {"requests": 0, "running": 0, "waiting": 0}
    steps_before = http.get("/health").json()["steps"]

    async def completion(client, prompt):
        stream = await client.completions.create(
            model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
        )
        return "".join([chunk.choices[0].text async for chunk in stream])

    async def chat(client, messages):
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        return "".join(json.loads(x[6:])["choices"][0]["delta"].get("content") or "" for x in lines[:-1])

    async def watch(client, stop):
        while not stop.is_set():
            health = (await client.get("/health")).json()
            for key, value in (("requests", health["requests"]), *health["engine"].items()):
                if key in peak:
                    peak[key] = max(peak[key], value)
            await asyncio.sleep(0.01)

    async def main():
        api = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as plain:
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch(plain, stop))
            results = await asyncio.wait_for(
                asyncio.gather(*(completion(api, p) for p in prompts), *(chat(plain, m) for m in chats)),
                timeout=2 * TIMEOUT,
            )
            stop.set()
            await watcher
        await api.close()
        return results

    results = asyncio.run(main())
    assert len(results) == 40  # none lost
    assert results[:24] == want
    assert results[24:] == want_chat
    assert peak["requests"] >= 32, f"at most {peak['requests']} requests were in the server at once"
    assert peak["running"] == 32, f"the engine's batch peaked at {peak['running']} sequences, not max_batch"
    assert peak["waiting"] >= 1  # the other 8 waited their turn
    health = idle(http, server)
    # continuous batching: far fewer engine steps than 40 requests x 16 tokens one after another
    assert health["steps"] - steps_before < 40 * max_tokens / 4


def test_a_client_disconnecting_mid_stream_frees_its_blocks_and_the_others_go_on(
    server, http, tok, reference
):
    url, srv = server
    idle(http, server)
    others = ["Once upon a time", "In the beginning", "Roses are red"]
    want = greedy(reference, tok, [tok.encode(p, bos=True) for p in others], 24)
    got: dict[int, str] = {}

    def other(i):
        with httpx.Client(base_url=url, timeout=TIMEOUT) as c:
            body = {"prompt": others[i], "max_tokens": 24, "temperature": 0, "stream": True}
            with c.stream("POST", "/v1/completions", json=body) as response:
                got[i] = _sse_text(response, chat=False)[0]

    long_body = {"prompt": "Tell me everything", "max_tokens": 200, "temperature": 0, "stream": True}
    with slow_steps(srv.engine), httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        with c.stream("POST", "/v1/completions", json=long_body) as response:
            lines = response.iter_lines()
            for _ in range(3):  # three tokens in: the request holds blocks
                assert next(line for line in lines if line).startswith("data: {")
            threads = [threading.Thread(target=other, args=(i,)) for i in range(len(others))]
            for t in threads:
                t.start()
            held = http.get("/health").json()
            assert held["free_blocks"] < held["num_blocks"] and held["requests"] >= 1
        # leaving the block closes the connection mid-stream, ~197 tokens early
        closed_at = http.get("/health").json()["steps"]
        for t in threads:
            t.join(TIMEOUT)
    assert [got.get(i) for i in range(len(others))] == want  # the others went on, unharmed
    health = idle(http, server)
    # freed at once: long before the 197 steps the abandoned request still had to run
    assert health["steps"] - closed_at < 100


def test_a_client_giving_up_on_a_plain_request_frees_its_blocks(server, http):
    url, srv = server
    idle(http, server)
    steps = http.get("/health").json()["steps"]
    with slow_steps(srv.engine):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                url + "/v1/completions",
                json={"prompt": "Go on and on", "max_tokens": 220, "temperature": 0},
                timeout=httpx.Timeout(TIMEOUT, read=0.5),
            )
        health = idle(http, server)
    assert health["steps"] - steps < 200  # aborted, not run to its 220 tokens


def test_a_full_pool_queues_requests_instead_of_failing_them(tok, reference):
    """A pool of 4 blocks (64 positions) and 6 requests of 30 positions each: they cannot all hold
    blocks at once, so some wait; every one completes with its greedy text."""
    engine = Engine(random_model(ARGS, seed=0), tok, block_size=16, num_blocks=4, max_batch=8)
    prompts = [f"Story number {i}:" for i in range(6)]
    assert {len(tok.encode(p, bos=True)) for p in prompts} == {6}
    want = greedy(reference, tok, [tok.encode(p, bos=True) for p in prompts], 24)
    with running(engine, tok) as (url, srv):
        results: dict[int, tuple] = {}
        peak = {"requests": 0, "waiting": 0}

        def one(i):
            body = {"prompt": prompts[i], "max_tokens": 24, "temperature": 0}
            with httpx.Client(base_url=url, timeout=2 * TIMEOUT) as c:
                response = c.post("/v1/completions", json=body)
                results[i] = (response.status_code, response.json())

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        with httpx.Client(base_url=url, timeout=TIMEOUT) as c:
            while any(t.is_alive() for t in threads):
                h = c.get("/health").json()
                peak["requests"] = max(peak["requests"], h["requests"])
                peak["waiting"] = max(peak["waiting"], h["engine"]["waiting"])
                time.sleep(0.02)
            for t in threads:
                t.join(2 * TIMEOUT)
            assert [results[i][0] for i in range(len(prompts))] == [200] * len(prompts)
            assert [results[i][1]["choices"][0]["text"] for i in range(len(prompts))] == want
            # more requests in flight at once than the pool holds (4 blocks: two requests of 30 positions), so
            # some queued; how many the 20 ms polls catch depends on the machine's load, not on the server
            assert peak["requests"] >= 3, peak
            idle(c, (url, srv))


def test_an_engine_that_fails_answers_500_then_503_never_hangs(tok):
    """A step that raises: the request in flight gets a 500 error object, /health turns 503 with the
    cause, and later requests get 503 at once (the engine's state is not trusted after a failure)."""
    engine = Engine(random_model(ARGS, seed=0), tok, max_batch=4)

    def broken():
        raise RuntimeError("a simulated fault in the forward pass")

    engine.step = broken
    with running(engine, tok) as (url, _), httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        first = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
        assert first.status_code == 500
        assert "simulated fault" in first.json()["error"]["message"]
        health = c.get("/health")
        assert health.status_code == 503 and "simulated fault" in health.json()["error"]
        body = {"prompt": "hi", "max_tokens": 4, "stream": True}
        later = c.post("/v1/completions", json=body)
        assert later.status_code == 503 and later.json()["error"]["type"] == "server_error"


def test_stop_strings_cut_the_text_streamed_or_not(server, http, tok, reference):
    prompt = "A list of fruits:"
    ids = tok.encode(prompt, bos=True)
    [out] = ml.generate(reference, [ids], max_new_tokens=20, stop_tokens=tok.stop_tokens)
    text = tok.decode(out)
    # a stop string that spans two tokens: the end of token 3 and the start of token 4
    cut = len(tok.decode(out[:4]))
    stop = text[cut - 2 : cut + 2]
    assert len(stop) == 4
    want = text[: text.find(stop)]
    body = {"prompt": prompt, "max_tokens": 20, "temperature": 0, "stop": [stop, "never appears"]}
    got = http.post("/v1/completions", json=body).json()
    assert got["choices"][0] == {"index": 0, "text": want, "logprobs": None, "finish_reason": "stop"}
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        streamed, reason, _ = _sse_text(response, chat=False)
    assert (streamed, reason) == (want, "stop")
    idle(http, server)  # the cut requests were aborted: their blocks are back


def test_seeded_sampling_repeats(http):
    body = {"prompt": "Pick a word:", "max_tokens": 12, "temperature": 0.9, "top_p": 0.95, "seed": 1234}
    first = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    again = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    other = http.post("/v1/completions", json={**body, "seed": 99}).json()["choices"][0]["text"]
    assert first == again
    assert other != first


TOO_LONG = list(range(1000, 1000 + ARGS.max_seq_len + 4))  # more token ids than the context holds
BAD = [
    # (case, path, body (bytes are sent as they are), status, words the message must contain)
    ("malformed JSON", "/v1/completions", b'{"prompt": "hi",', 400, ["not valid JSON"]),
    ("not an object", "/v1/completions", b'["hi"]', 400, ["JSON object"]),
    ("not UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, ["not valid JSON"]),
    ("prompt a number", "/v1/completions", {"prompt": 5}, 400, ["'prompt'"]),
    ("max_tokens a string", "/v1/completions", {"prompt": "hi", "max_tokens": "5"}, 400, ["'max_tokens'"]),
    ("stream a string", "/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, ["'stream'"]),
    ("messages a string", "/v1/chat/completions", {"messages": "hi"}, 400, ["'messages'"]),
    ("no messages", "/v1/chat/completions", {"messages": []}, 400, ["'messages'"]),
    ("unknown role", "/v1/chat/completions", {"messages": [{"role": "bot", "content": "x"}]}, 400, ["role"]),
    ("no prompt", "/v1/completions", {"max_tokens": 5}, 400, ["missing", "'prompt'"]),
    (
        "unknown field",
        "/v1/completions",
        {"prompt": "hi", "frequency_penality": 1},
        400,
        ["unknown field 'frequency_penality'", "accepts"],
    ),  # fmt: skip
    ("max_tokens 0", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, ["'max_tokens'", "1"]),
    (
        "max_tokens -3",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": -3},
        400,
        ["'max_tokens'"],
    ),  # fmt: skip
    (
        "max_tokens past the context",
        "/v1/completions",
        {"prompt": "hi", "max_tokens": 10_000},
        400,
        [f"maximum context length is {ARGS.max_seq_len}", "lower max_tokens"],
    ),  # fmt: skip
    (
        "prompt past the context",
        "/v1/completions",
        {"prompt": TOO_LONG, "max_tokens": 1},
        400,
        [f"maximum context length is {ARGS.max_seq_len}", f"{len(TOO_LONG)}"],
    ),  # fmt: skip
    (
        "chat past the context",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "llama " * 300}]},
        400,
        [f"maximum context length is {ARGS.max_seq_len}"],
    ),  # fmt: skip
    ("token id past the vocabulary", "/v1/completions", {"prompt": [1, 128_256]}, 400, ["vocabulary"]),
    ("temperature < 0", "/v1/completions", {"prompt": "hi", "temperature": -0.5}, 400, ["'temperature'"]),
    ("top_p 0", "/v1/completions", {"prompt": "hi", "top_p": 0}, 400, ["'top_p'"]),
    ("n 2", "/v1/completions", {"prompt": "hi", "n": 2}, 400, ["'n'"]),
    ("a penalty", "/v1/completions", {"prompt": "hi", "presence_penalty": 0.5}, 400, ["not supported"]),
    (
        "logprobs",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "logprobs": True},
        400,
        ["logprobs=True is not supported"],
    ),  # fmt: skip
    (
        "five stop strings",
        "/v1/completions",
        {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]},
        400,
        ["'stop'"],
    ),  # fmt: skip
    (
        "unknown model",
        "/v1/completions",
        {"prompt": "hi", "model": "gpt-4o"},
        404,
        ["'gpt-4o' does not exist"],
    ),
    (
        "a path as the model",
        "/v1/chat/completions",
        {"model": "../../etc/passwd", "messages": [{"role": "user", "content": "x"}]},
        404,
        ["does not exist"],
    ),  # fmt: skip
    ("a 10 MB body", "/v1/completions", b'{"prompt": "' + b"a" * 10_000_000 + b'"}', 413, ["larger than"]),
    ("unknown path", "/v1/embeddings", {"input": "hi"}, 404, ["no route"]),
]


@pytest.mark.parametrize("case,path,body,status,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_an_openai_error_and_the_server_goes_on(http, case, path, body, status, words):
    if isinstance(body, bytes):
        response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        response = http.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], error["message"]
    # still serving
    ok = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_the_openai_client_raises_its_own_errors(server):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    with pytest.raises(openai.BadRequestError, match=f"maximum context length is {ARGS.max_seq_len}"):
        client.completions.create(model=NAME, prompt="hi", max_tokens=ARGS.max_seq_len)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="'temperature'"):
        client.completions.create(model=NAME, prompt="hi", temperature=-1)


@pytest.fixture(scope="module", autouse=True)
def cli(tmp_path_factory, reference):
    """`python -m minillama serve --checkpoint DIR` in a child process, started with the module's first
    test so that its start (imports, loading) overlaps the other tests; killed at the end if still up."""
    tmp = tmp_path_factory.mktemp("cli")
    ml.save(reference, tmp / "ckpt")
    (tmp / "run").mkdir()
    with socket.socket() as s:  # a free port for the child (bound, read, released)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["serve", "--checkpoint", str(tmp / "ckpt"), "--port", str(port), "--log-level", "warning"]
    child = subprocess.Popen(
        [sys.executable, "-m", "minillama", *argv],
        cwd=tmp / "run",
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield child, port, tmp / "run"
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=30)


def test_neutral_openai_parameters_are_accepted(server):
    """Clients that send OpenAI's defaults for what this server lacks (penalties 0, no logit bias) work;
    max_completion_tokens is max_tokens' newer name."""
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    reply = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=5,
        temperature=0,
        presence_penalty=0,
        frequency_penalty=0.0,
        logit_bias={},
        logprobs=False,
        n=1,
    )
    assert reply.usage.completion_tokens == 5


def test_cli_serves_on_loopback_only_and_stops(cli, reference, tok):
    """By default nothing listens beyond 127.0.0.1; the checkpoint's greedy text comes back; SIGINT
    stops the server with exit code 0, having written nothing where it ran."""
    child, port, run_dir = cli
    [want] = greedy(reference, tok, [tok.encode("hi", bos=True)], 3)

    def up():
        assert child.poll() is None, child.communicate()[1]
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    _until(up, 90, "`serve` did not answer /health")
    listening = [
        c.laddr
        for c in psutil.Process(child.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=TIMEOUT, max_retries=0
    )
    assert client.models.list().data[0].id == "ckpt"
    reply = client.completions.create(model="ckpt", prompt="hi", max_tokens=3, temperature=0)
    assert reply.choices[0].text == want
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert f"serving 'ckpt' on http://127.0.0.1:{port}/v1" in err
    assert list(run_dir.iterdir()) == []  # nothing written where it ran


def test_serve_arguments():
    from minillama.__main__ import main, parser

    ns = parser().parse_args(["serve", "--model", "tiny"])
    assert (ns.host, ns.port) == ("127.0.0.1", 8000)
    assert main(["serve"]) == 2
    assert main(["serve", "--model", "tiny", "--port", "70000"]) == 2


def test_the_readme_client_snippet_runs(server, capsys):
    """The README's client snippet, pointed at this server, runs and streams the reply."""
    readme = (ROOT / "README.md").read_text().split("## Serving: an OpenAI-compatible server", 1)[1]
    snippet = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(snippet.strip().splitlines()) == 6
    snippet = snippet.replace("http://127.0.0.1:8000", server[0]).replace("smollm2-135m", NAME)
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)
    reply = namespace["reply"]
    assert reply.usage.completion_tokens == 64 and reply.choices[0].finish_reason == "length"
    assert capsys.readouterr().out.startswith(reply.choices[0].message.content + "\n")
