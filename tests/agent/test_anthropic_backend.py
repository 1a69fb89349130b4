"""The anthropic backend against a mocked HTTP transport (the real SDK, no network)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anthropic
import httpx2
import pytest
import typing_extensions
from agent_helpers import GOOD_MODULE, FakeVerifier, reply

from coda_agent.agent.llm import default_backend_name, make_backend
from coda_agent.agent.llm.anthropic import DEFAULT_MODEL, AnthropicBackend
from coda_agent.agent.llm.base import LLMAuthError, LLMError
from coda_agent.agent.loop import generate
from coda_agent.agent.render import build_repair_prompt, render_prompt

SECRET = "sk-ant-api03-TOPSECRET-abcdef0123456789"


def message_body(text="```python\nx = 1\n```\n", *, cache_read=7000, cache_write=0, model="claude-opus-5-5"):
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 1234,
            "output_tokens": 567,
            "cache_read_input_tokens": cache_read,
            "cache_creation_input_tokens": cache_write,
        },
    }


def error_body(kind: str, msg: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": msg}}


def sse_events(body: dict, *, thinking: str | None = None, chunk: int = 7) -> list[tuple[str, dict]]:
    """``body`` (a complete Message) as the Messages API streams it: message_start (input
    and cache usage), content blocks in deltas of ``chunk`` characters (an optional thinking
    block first), message_delta (stop reason, output tokens), message_stop."""
    u = body["usage"]
    start = dict(body, content=[], stop_reason=None, stop_sequence=None, usage=dict(u, output_tokens=1))
    ev: list[tuple[str, dict]] = [("message_start", {"type": "message_start", "message": start})]
    blocks = ([("thinking", thinking)] if thinking is not None else []) + [("text", b["text"]) for b in body["content"]]
    for i, (kind, text) in enumerate(blocks):
        first = (
            {"type": "thinking", "thinking": "", "signature": ""}
            if kind == "thinking"
            else {"type": "text", "text": ""}
        )
        ev.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": first}))
        for j in range(0, len(text), chunk):
            delta = (
                {"type": "thinking_delta", "thinking": text[j : j + chunk]}
                if kind == "thinking"
                else {"type": "text_delta", "text": text[j : j + chunk]}
            )
            ev.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}))
        if kind == "thinking":
            ev.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "signature_delta", "signature": "sig"},
                    },
                )
            )
        ev.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    ev.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": u["output_tokens"]},
            },
        )
    )
    ev.append(("message_stop", {"type": "message_stop"}))
    return ev


def sse_bytes(events: list[tuple[str, dict]]) -> bytes:
    return "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events).encode()


class _Stream(httpx2.SyncByteStream):
    """A response body that sends ``data`` and then raises ``error`` (a connection lost mid-stream)."""

    def __init__(self, data: bytes, error: Exception):
        self.data, self.error = data, error

    def __iter__(self):
        yield self.data
        raise self.error


class Server:
    """A scripted Messages API: each request pops the next reply. A reply is an exception
    (raised by the transport), ``(status, body[, headers])`` (a 200 with a Message body is
    sent as its event stream when the request asked to stream), ``("sse", events)`` or
    ``("sse", events, exception)`` (the events, then the exception mid-stream),
    ``("raw", bytes)`` (an event-stream body as is) or ``("json200",)`` (a whole Message
    as JSON, what a proxy that ignores ``stream`` sends)."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        item = self.replies.pop(0)
        if isinstance(item, Exception):
            raise item
        sse = {"content-type": "text/event-stream"}
        if item[0] == "json200":
            return httpx2.Response(200, json=message_body())
        if item[0] == "raw":
            return httpx2.Response(200, headers=sse, content=item[1])
        if item[0] == "sse":
            data = sse_bytes(item[1])
            if len(item) > 2:
                return httpx2.Response(200, headers=sse, stream=_Stream(data, item[2]))
            return httpx2.Response(200, headers=sse, content=data)
        status, body, *headers = item
        if status == 200 and json.loads(request.content).get("stream"):
            return httpx2.Response(200, headers=sse, content=sse_bytes(sse_events(body)))
        return httpx2.Response(status, json=body, headers=headers[0] if headers else {})

    def body(self, i: int = 0) -> dict:
        return json.loads(self.requests[i].content)


def backend(server: Server, **kw) -> tuple[AnthropicBackend, list[float]]:
    sleeps: list[float] = []
    kw.setdefault("max_retries", 0)  # exercise our own retry loop deterministically
    b = AnthropicBackend(
        api_key=SECRET,
        http_client=httpx2.Client(transport=httpx2.MockTransport(server)),
        sleep=sleeps.append,
        **kw,
    )
    return b, sleeps


def test_request_shape_and_usage(workspace, fwd_spec, monkeypatch):
    monkeypatch.delenv("CODA_MODEL", raising=False)
    monkeypatch.delenv("CODA_THINKING", raising=False)
    server = Server((200, message_body(cache_read=7000, cache_write=12)))
    b, _ = backend(server)
    prompt = render_prompt(fwd_spec, workspace)
    r = b.complete(prompt)
    assert r.text == "```python\nx = 1\n```\n" and r.model == "claude-opus-5-5" and r.stop_reason == "end_turn"
    assert r.usage.input_tokens == 1234 and r.usage.output_tokens == 567
    assert r.usage.cache_read_input_tokens == 7000 and r.usage.cache_creation_input_tokens == 12

    req = server.requests[0]
    assert req.url.path == "/v1/messages" and SECRET in (
        req.headers.get("x-api-key", "") + req.headers.get("authorization", "")
    )
    body = server.body()
    assert body["model"] == DEFAULT_MODEL == "claude-opus-5-5"
    assert body["max_tokens"] == 16000 and body["stream"] is True
    assert "thinking" not in body
    system = body["system"]
    assert [blk["text"] for blk in system] == prompt.system_blocks
    assert [("cache_control" in blk) for blk in system] == [False, False, False, True]
    assert system[-1]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": prompt.messages[0]["content"], "cache_control": {"type": "ephemeral"}}
            ],
        }
    ]


def test_repair_request_keeps_cache_prefix(workspace, fwd_spec):
    server = Server((200, message_body()))
    b, _ = backend(server)
    base = render_prompt(fwd_spec, workspace)
    rp = build_repair_prompt(
        base,
        previous_response="```python\nx=1\n```",
        previous_candidate="x=1\n",
        feedback="bad",
        attempt=2,
        max_attempts=5,
    )
    b.complete(rp)
    body = server.body()
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in body["messages"][1]["content"][0]
    assert "cache_control" not in body["messages"][2]["content"][0]
    assert sum("cache_control" in blk for blk in body["system"]) == 1


def test_default_model_is_in_sdk_literals():
    models = typing_extensions.get_args(typing_extensions.get_args(anthropic.types.Model)[0])
    assert DEFAULT_MODEL in models


def test_model_from_env_and_flag(monkeypatch):
    monkeypatch.setenv("CODA_MODEL", "claude-sonnet-5-5")
    server = Server()
    assert backend(server)[0].model == "claude-sonnet-5-5"
    assert backend(server, model="claude-opus-4-8")[0].model == "claude-opus-4-8"


@pytest.mark.parametrize(
    "first",
    [
        (429, error_body("rate_limit_error", "Number of requests has exceeded your rate limit")),
        (529, error_body("overloaded_error", "Overloaded")),
        httpx2.ConnectError("connection refused"),
    ],
    ids=["429", "529", "connect"],
)
def test_transient_errors_retried(workspace, fwd_spec, first):
    server = Server(first, (200, message_body()))
    b, sleeps = backend(server, attempts=3, backoff_base_s=2.0)
    r = b.complete(render_prompt(fwd_spec, workspace))
    assert r.usage.cache_read_input_tokens == 7000
    assert len(server.requests) == 2
    assert len(sleeps) == 1 and 1.0 <= sleeps[0] <= 2.0  # base 2 s, jitter in [base/2, base]


def test_sdk_level_retry_honours_retry_after(workspace, fwd_spec):
    server = Server((429, error_body("rate_limit_error", "slow down"), {"retry-after-ms": "1"}), (200, message_body()))
    b, sleeps = backend(server, max_retries=2, attempts=1)
    assert b.complete(render_prompt(fwd_spec, workspace)).text.startswith("```python")
    assert len(server.requests) == 2 and sleeps == []  # the SDK retried, not our loop


def test_retries_are_bounded_with_exponential_backoff(workspace, fwd_spec):
    server = Server(*[(529, error_body("overloaded_error", "Overloaded"))] * 4)
    b, sleeps = backend(server, attempts=4, backoff_base_s=1.0, backoff_max_s=3.0)
    with pytest.raises(LLMError, match=r"still failing after 4 attempts \(HTTP 529 overloaded\)"):
        b.complete(render_prompt(fwd_spec, workspace))
    assert len(server.requests) == 4 and len(sleeps) == 3
    assert 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0 and 1.5 <= sleeps[2] <= 3.0  # capped at 3


def test_auth_error_is_clear_and_not_retried(workspace, fwd_spec):
    server = Server((401, error_body("authentication_error", "invalid x-api-key")))
    b, sleeps = backend(server, attempts=3)
    with pytest.raises(LLMAuthError) as ei:
        b.complete(render_prompt(fwd_spec, workspace))
    msg = str(ei.value)
    assert msg.startswith("ANTHROPIC_API_KEY rejected") and "HTTP 401" in msg
    assert SECRET not in msg and len(server.requests) == 1 and sleeps == []


def test_bad_request_not_retried(workspace, fwd_spec):
    server = Server((400, error_body("invalid_request_error", "max_tokens: too large")))
    b, sleeps = backend(server, attempts=3)
    with pytest.raises(LLMError, match=r"HTTP 400.*max_tokens: too large"):
        b.complete(render_prompt(fwd_spec, workspace))
    assert len(server.requests) == 1 and sleeps == []


def test_missing_key_explains_choices(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert default_backend_name() is None
    with pytest.raises(LLMError, match=r"ANTHROPIC_API_KEY is not set.*--llm manual.*--llm command"):
        make_backend("anthropic")
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    assert default_backend_name() == "anthropic"
    b = make_backend("anthropic", model=None, max_tokens=8000)
    assert isinstance(b, AnthropicBackend) and b.max_tokens == 8000


@pytest.mark.parametrize("value", ["abc", "0", "-5"])
def test_a_bad_max_tokens_is_an_llm_error(monkeypatch, value):
    """CODA_MAX_TOKENS=abc is an LLMError naming the variable, not a ValueError traceback."""
    monkeypatch.setenv("CODA_MAX_TOKENS", value)
    with pytest.raises(LLMError, match=r"CODA_MAX_TOKENS\) must be"):
        AnthropicBackend(api_key=SECRET, http_client=httpx2.Client(transport=httpx2.MockTransport(Server())))


def test_thinking_option(workspace, fwd_spec):
    server = Server((200, message_body()), (200, message_body()))
    b, _ = backend(server, thinking="adaptive")
    b.complete(render_prompt(fwd_spec, workspace))
    assert server.body()["thinking"] == {"type": "adaptive"}
    b2, _ = backend(server, thinking=4096)
    b2.complete(render_prompt(fwd_spec, workspace))
    assert server.body(1)["thinking"] == {"type": "enabled", "budget_tokens": 4096}


def test_key_never_in_repr_logs_or_run_files(workspace, fwd_spec, caplog, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    server = Server(
        (529, error_body("overloaded_error", "Overloaded")),
        (200, message_body(reply("bad module, no marker\nx = 1\n"), cache_read=0, cache_write=9000)),
        (200, message_body(reply(GOOD_MODULE), cache_read=9000)),
        (200, message_body("Write the ragged tile.", cache_read=9000)),
    )
    b, _ = backend(server, attempts=3)
    assert SECRET not in repr(b) and "redacted" in repr(b)
    run_dir = workspace / "runs" / "anthropic"
    s = generate(fwd_spec, root=workspace, backend=b, verifier=FakeVerifier(), run_dir=run_dir)
    assert s.status == "passed" and len(server.requests) == 4
    assert s.attempts[1].usage.cache_read_input_tokens == 9000 and s.cache_hits == 2
    assert run_dir.is_dir()
    for p in Path(run_dir).rglob("*"):
        if p.is_file():
            assert SECRET not in p.read_text(errors="replace"), p
            assert "TOPSECRET" not in p.read_text(errors="replace"), p
    assert SECRET not in caplog.text and "TOPSECRET" not in caplog.text
    assert SECRET not in s.render()


def test_a_timeout_is_not_retried_by_the_outer_loop(workspace, fwd_spec):
    """The SDK retries a timeout itself; the outer loop retrying it too would make 4 x 3
    billed tries of up to 600 s each."""
    server = Server(httpx2.ReadTimeout("read timed out"), (200, message_body()))
    b, sleeps = backend(server, attempts=4)
    with pytest.raises(LLMError, match=r"no answer within 600 s"):
        b.complete(render_prompt(fwd_spec, workspace))
    assert len(server.requests) == 1 and sleeps == []


def test_streamed_answer_is_accumulated(workspace, fwd_spec):
    """Thinking blocks are dropped, text deltas joined, usage taken from message_start
    (input, cache) and message_delta (output tokens); a max_tokens stop is reported."""
    text = "```python\n" + "x = 1\n" * 300 + "```\n"
    body = message_body(text, cache_read=5, cache_write=6)
    body["stop_reason"] = "max_tokens"
    server = Server(("sse", sse_events(body, thinking="Let me think. " * 50)))
    b, _ = backend(server)
    r = b.complete(render_prompt(fwd_spec, workspace))
    assert r.text == text and r.stop_reason == "max_tokens" and r.model == "claude-opus-5-5"
    assert (r.usage.input_tokens, r.usage.output_tokens) == (1234, 567)
    assert (r.usage.cache_read_input_tokens, r.usage.cache_creation_input_tokens) == (5, 6)


def test_a_large_max_tokens_is_sent_streamed(workspace, fwd_spec):
    """64k output tokens: the SDK refuses that without streaming (expected > 10 min)."""
    server = Server((200, message_body()))
    b, _ = backend(server, max_tokens=64000, thinking="adaptive")
    assert b.complete(render_prompt(fwd_spec, workspace)).text.startswith("```python")
    assert server.body()["max_tokens"] == 64000 and server.body()["stream"] is True


@pytest.mark.parametrize("kind", ["overloaded_error", "api_error", "rate_limit_error"])
def test_an_error_event_mid_stream_is_retried(workspace, fwd_spec, kind):
    """An error event after some text arrives on a 200 response; judged by its type (529,
    500, 429) it is retried as the same HTTP error would be, not matched by a substring
    ("overloaded") with the rest failing the run as "HTTP 200"."""
    events = sse_events(message_body())[:3] + [("error", error_body(kind, "something"))]
    server = Server(("sse", events), (200, message_body()))
    b, sleeps = backend(server, attempts=3, backoff_base_s=2.0)
    assert b.complete(render_prompt(fwd_spec, workspace)).text == "```python\nx = 1\n```\n"
    assert len(server.requests) == 2 and len(sleeps) == 1


def test_a_request_error_event_mid_stream_is_not_retried(workspace, fwd_spec):
    events = sse_events(message_body())[:3] + [("error", error_body("invalid_request_error", "bad thing"))]
    server = Server(("sse", events), (200, message_body()))
    b, sleeps = backend(server, attempts=3)
    with pytest.raises(LLMError, match=r"Anthropic API error \(invalid_request_error event in the stream\).*bad thing"):
        b.complete(render_prompt(fwd_spec, workspace))
    assert len(server.requests) == 1 and sleeps == []


def test_a_200_that_is_not_an_event_stream_is_an_error(workspace, fwd_spec):
    """A proxy that ignores ``stream`` answers every billed try the same way: not retried."""
    server = Server(("json200",), (200, message_body()))
    b, sleeps = backend(server, attempts=3)
    with pytest.raises(LLMError, match=r"asked for an event stream, got content type 'application/json'"):
        b.complete(render_prompt(fwd_spec, workspace))
    assert len(server.requests) == 1 and sleeps == []


BROKEN = {
    "connection lost": ("sse", sse_events(message_body())[:4], httpx2.RemoteProtocolError("peer closed connection")),
    "ended early": ("sse", sse_events(message_body())[:4]),
    "empty stream": ("sse", []),
    "pings only": ("sse", [("ping", {"type": "ping"})]),
    "decoding error": ("sse", sse_events(message_body())[:4], httpx2.DecodingError("bad gzip")),
    "event not JSON": ("raw", sse_bytes(sse_events(message_body())[:3]) + b"event: content_block_delta\ndata: {no\n\n"),
}


@pytest.mark.parametrize("cut", list(BROKEN))
def test_a_broken_stream_is_retried(workspace, fwd_spec, cut):
    """A stream that breaks off part-way (the connection drops, the events stop before the
    stop reason or never start, a decoding error, an event that is not JSON) is retried,
    never returned as a (truncated) answer nor raised as a raw SDK/parser exception."""
    first = BROKEN[cut]
    server = Server(first, (200, message_body()))
    b, sleeps = backend(server, attempts=3, backoff_base_s=2.0)
    r = b.complete(render_prompt(fwd_spec, workspace))
    assert r.text == "```python\nx = 1\n```\n" and r.stop_reason == "end_turn"
    assert len(server.requests) == 2 and len(sleeps) == 1


def test_a_stream_that_stalls_is_not_retried(workspace, fwd_spec):
    """A read timeout part-way through the stream: an error telling the user to resume, no
    outer retry (as for a timeout before the first byte)."""
    server = Server(("sse", sse_events(message_body())[:4], httpx2.ReadTimeout("timed out")), (200, message_body()))
    b, sleeps = backend(server, attempts=4)
    with pytest.raises(LLMError, match=r"stalled \(no event for 600 s\) part-way.*summary prints the command"):
        b.complete(render_prompt(fwd_spec, workspace))
    assert len(server.requests) == 1 and sleeps == []
