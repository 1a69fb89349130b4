"""The Anthropic backend (official ``anthropic`` SDK).

Design
------
* **Prompt caching.** The system prompt goes as a list of text blocks; the last static
  block (rules + docs + examples + tricks: identical for every attempt of a run and for
  the lesson call) carries ``cache_control: {"type": "ephemeral"}``, and so does the
  task message (identical in every repair prompt). Attempts 2..n then read that prefix
  from the cache; ``usage.cache_read_input_tokens`` shows it in the run summary.
* **Retries, two layers.** The SDK client retries quickly (``max_retries``, honouring
  ``retry-after``) on 408/409/429/5xx, connection errors and timeouts. Above it, a
  bounded loop with exponential backoff + jitter (``attempts`` = 6, ``backoff_base_s`` =
  5 s doubling, capped at ``backoff_max_s`` = 60 s, jittered down to half: at most 135 s of waiting)
  rides out rate limiting and ``overloaded`` (529) spells without failing a generation
  run that may already have spent GPU time. A timeout is not retried by that loop: the
  client already retried it and every try may be billed.
* **Errors a user can act on** become :class:`LLMError` with a plain message; a rejected
  key (401/403) is :class:`LLMAuthError` and is never retried.
* **The key is a secret.** It is passed to the SDK client and never stored on this
  object, never logged and never written to run files; ``repr`` shows it redacted.
* **Streaming** (``messages.stream``, then the accumulated final message): the
  ``timeout`` (default 600 s) bounds each wait for the next event, not the whole answer,
  so a large ``CODA_MAX_TOKENS`` or thinking budget that takes longer than 10 minutes
  still completes (the SDK refuses such requests without streaming), and an idle
  connection is never held open for the whole generation. A stream that breaks off
  (a transport or decoding error, an event that is not JSON, an end before the stop
  reason) is retried by the outer loop like a connection error; one that stalls for
  ``timeout`` is not (as a timeout of the first byte). An ``error`` event inside the
  stream arrives on a 200 response; it is judged by its error type
  (:data:`ERROR_TYPE_STATUS`: ``overloaded_error`` as 529, ``api_error`` as 500 ...), so
  it is retried exactly when the same HTTP error would be. A 200 that is not an event
  stream (a proxy that ignores ``stream``) is an error, not retried.

Configuration: ``model`` (``--model``) > ``$CODA_MODEL`` > :data:`DEFAULT_MODEL`;
``$CODA_MAX_TOKENS``; ``$CODA_THINKING`` (``adaptive`` or a budget in tokens) enables
extended thinking when set.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from typing import Any, Callable

from .base import LLMAuthError, LLMError, LLMResponse, Usage

log = logging.getLogger(__name__)

DEFAULT_MODEL = "claude-opus-5-5"
"""The newest Opus id in the installed SDK's model literals (anthropic 2.14)."""
DEFAULT_MAX_TOKENS = 16000
DEFAULT_TIMEOUT_S = 600.0

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


def redact(secret: str | None) -> str:
    """A secret shown safely: ``sk-ant-…(redacted)`` style, never the value."""
    if not secret:
        return "<unset>"
    return f"{secret[:6]}…(redacted)" if len(secret) > 12 else "…(redacted)"


def _thinking_param(value: str | int | None) -> dict[str, Any] | None:
    if value in (None, "", "off", "none", "0", 0):
        return None
    if str(value) == "adaptive":
        return {"type": "adaptive"}
    try:
        budget = int(value)  # type: ignore[arg-type]
    except ValueError:
        raise LLMError(f"thinking must be 'adaptive' or a token budget (int), got {value!r}") from None
    return {"type": "enabled", "budget_tokens": budget}


class AnthropicBackend:
    """Claude through the official SDK; see the module docstring for the design."""

    name = "anthropic"
    parallel_calls = True
    """Several calls at once are safe (``--candidates``: each on a shallow copy; the SDK client is thread-safe)."""

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        max_tokens: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = 2,
        attempts: int = 6,
        backoff_base_s: float = 5.0,
        backoff_max_s: float = 60.0,
        thinking: str | int | None = None,
        temperature: float | None = None,
        client: Any = None,
        http_client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.model = model or os.environ.get("CODA_MODEL") or DEFAULT_MODEL
        raw = max_tokens or os.environ.get("CODA_MAX_TOKENS") or DEFAULT_MAX_TOKENS
        try:
            self.max_tokens = int(raw)
        except ValueError:
            raise LLMError(f"max_tokens (CODA_MAX_TOKENS) must be a whole number of tokens, got {raw!r}") from None
        if self.max_tokens < 1:
            raise LLMError(f"max_tokens (CODA_MAX_TOKENS) must be >= 1, got {self.max_tokens}")
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.thinking = _thinking_param(thinking if thinking is not None else os.environ.get("CODA_THINKING"))
        self.temperature = temperature
        self._sleep = sleep
        if client is None:
            import anthropic

            key = api_key or os.environ.get("ANTHROPIC_API_KEY")
            if not key:
                raise LLMError(
                    "ANTHROPIC_API_KEY is not set: export it, or use --llm manual "
                    '(answer in a file) or --llm command --cmd "CMD" (pipe the prompt to a command)'
                )
            kw: dict[str, Any] = {"api_key": key, "timeout": timeout_s, "max_retries": max_retries}
            if http_client is not None:
                kw["http_client"] = http_client
            client = anthropic.Anthropic(**kw)
            self._key_hint = redact(key)
        else:
            self._key_hint = "<client supplied>"
        self._client = client

    def __repr__(self) -> str:
        return f"AnthropicBackend(model={self.model!r}, max_tokens={self.max_tokens}, api_key={self._key_hint!r})"

    # -- request ------------------------------------------------------------------
    def request_params(self, prompt: Any) -> dict[str, Any]:
        """The ``messages.stream`` keyword arguments for ``prompt`` (no secrets)."""
        system: list[dict[str, Any]] = []
        for i, text in enumerate(prompt.system_blocks):
            block: dict[str, Any] = {"type": "text", "text": text}
            if i == prompt.cache_block_index:
                block["cache_control"] = {"type": "ephemeral"}
            system.append(block)
        messages: list[dict[str, Any]] = []
        for i, m in enumerate(prompt.messages):
            block = {"type": "text", "text": m["content"]}
            # Breakpoints: at most 4 per request; we use <= 2 (system + task message).
            if i in prompt.cache_messages:
                block["cache_control"] = {"type": "ephemeral"}
            messages.append({"role": m["role"], "content": [block]})
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": system,
            "messages": messages,
        }
        if self.thinking is not None:
            params["thinking"] = self.thinking
        if self.temperature is not None:
            params["temperature"] = self.temperature
        return params

    def _backoff(self, attempt: int) -> float:
        base = min(self.backoff_max_s, self.backoff_base_s * (2 ** (attempt - 1)))
        return base * (0.5 + random.random() / 2)  # jitter in [base/2, base]

    def complete(self, prompt: Any) -> LLMResponse:
        """One completion, streamed, retried on rate limits / overload / connection errors."""
        import anthropic
        import httpx2  # the SDK's HTTP client (a dependency of anthropic 2.x): mid-stream errors

        params = self.request_params(prompt)
        last: Exception | None = None
        what = ""
        for attempt in range(1, self.attempts + 1):
            started = False  # the response headers arrived: a timeout from here on is a stall
            try:
                with self._client.messages.stream(**params) as stream:
                    started = True
                    kind = stream.response.headers.get("content-type", "")
                    if not kind.startswith("text/event-stream"):
                        # Not retried: a proxy that answers this way will on every billed try.
                        raise LLMError(
                            "Anthropic API: asked for an event stream, got "
                            + (f"content type {kind!r}" if kind else "no content type")
                            + " "
                            "(a proxy at ANTHROPIC_BASE_URL that does not pass streaming through?)"
                        )
                    msg = _final_message(stream)
                return to_response(msg)
            except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as e:
                raise LLMAuthError(
                    f"ANTHROPIC_API_KEY rejected by the Anthropic API (HTTP {e.status_code}): check that "
                    "the key is current and has access to model "
                    f"{self.model!r} (or choose another with --model / CODA_MODEL)"
                ) from None
            except anthropic.NotFoundError as e:
                raise LLMError(
                    f"Anthropic API: model {self.model!r} not found (HTTP {e.status_code}); "
                    "choose another with --model / CODA_MODEL"
                ) from None
            except anthropic.APIStatusError as e:
                status, label = _status(e)
                overloaded = status == 529 or "overloaded" in str(e).lower()
                if status not in RETRYABLE_STATUS and not overloaded:
                    raise LLMError(f"Anthropic API error ({label}): {_short(e)}") from None
                last = e
                what = label + (" overloaded" if overloaded and "overloaded" not in label else "")
            except (anthropic.APITimeoutError, httpx2.TimeoutException):
                # Never retried here. Before the first byte the SDK already retried it
                # (max_retries), each try may have been billed, and 4 x 3 tries of a 600 s
                # timeout is two hours. After the headers the stream stalled: nobody retries a
                # started body (the tokens so far were billed). anthropic 2.17+ raises
                # APITimeoutError for both; older 2.x raised the raw httpx2 error mid-stream,
                # so `started` decides which one happened (tests/agent/test_anthropic_backend.py).
                if started:
                    raise LLMError(
                        f"Anthropic API: the answer stalled (no event for {self.timeout_s:.0f} s) part-way "
                        "through; resume the run later (the run's summary prints the command)"
                    ) from None
                raise LLMError(
                    f"Anthropic API: no answer within {self.timeout_s:.0f} s (after the client's own "
                    "retries); resume the run later (the run's summary prints the command)"
                ) from None
            except (anthropic.APIConnectionError, httpx2.RequestError, json.JSONDecodeError, _BrokenStream) as e:
                # APIConnectionError: before the first byte (the SDK retried it already);
                # the others: the stream broke off part-way (a transport or decoding error,
                # an event that is not JSON, no complete message).
                last = e
                what = f"connection error ({type(e).__name__})"
            if attempt < self.attempts:
                delay = self._backoff(attempt)
                log.warning("anthropic: %s; retry %d/%d in %.1fs", what, attempt, self.attempts - 1, delay)
                self._sleep(delay)
        raise LLMError(
            f"Anthropic API still failing after {self.attempts} attempts ({what}): {_short(last)}; "
            "resume the run later (the run's summary prints the command)"
        )


class _BrokenStream(Exception):
    """The event stream ended without a complete message (retried as a connection error)."""


ERROR_TYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
"""The HTTP status each documented API error type stands for. An ``error`` event inside a
stream arrives on a 200 response, so the SDK's exception carries status 200; its type
says what it is."""


def _status(e: Any) -> tuple[int, str]:
    """(status to act on, label) of an SDK ``APIStatusError``: its HTTP status, or for an
    ``error`` event inside a stream the status of the event's error type (unknown: 500)."""
    if e.status_code >= 400:
        return e.status_code, f"HTTP {e.status_code}"
    body = e.body if isinstance(e.body, dict) else {}
    raw = body.get("error")
    err = raw if isinstance(raw, dict) else {}
    kind = str(err.get("type", "unknown"))
    return ERROR_TYPE_STATUS.get(kind, 500), f"{kind} event in the stream"


def _final_message(stream: Any) -> Any:
    """The stream's accumulated message, or :class:`_BrokenStream` when it is incomplete:
    no ``message_start`` (the SDK asserts on that; under ``python -O`` it returns None)
    or no stop reason (the events ended before ``message_delta``)."""
    try:
        msg = stream.get_final_message()
    except AssertionError:
        msg = None
    if msg is None:
        raise _BrokenStream("the stream ended before the message began")
    if msg.stop_reason is None:
        raise _BrokenStream("the stream ended before the message was complete")
    return msg


def _short(e: BaseException | None, n: int = 300) -> str:
    s = str(e) if e is not None else ""
    return s if len(s) <= n else s[:n] + "…"


def to_response(msg: Any) -> LLMResponse:
    """An SDK ``Message`` as :class:`LLMResponse` (text blocks joined; thinking dropped)."""
    text = "".join(getattr(b, "text", "") for b in msg.content if getattr(b, "type", None) == "text")
    u = msg.usage
    return LLMResponse(
        text=text,
        model=msg.model,
        stop_reason=msg.stop_reason,
        usage=Usage(
            input_tokens=u.input_tokens or 0,
            output_tokens=u.output_tokens or 0,
            cache_read_input_tokens=u.cache_read_input_tokens or 0,
            cache_creation_input_tokens=u.cache_creation_input_tokens or 0,
        ),
    )
