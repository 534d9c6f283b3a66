"""The project's one client for OpenAI-compatible chat endpoints: retries, an on-disk response
cache (so runs are reproducible) and token accounting of every call. Shared by the LLM
extractor, the planner, consolidation and the evaluation's answer stage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import queue
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import openai
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from openai.types.chat import ChatCompletion

from retrieval.llm_usage import LLMUsage
from retrieval.memory import strict_json
from retrieval.memory.records import lone_surrogate
from retrieval.memory.targets import redacted

logger = logging.getLogger(__name__)


def user_answers(cache_dir: Path, user: str) -> Path:
    """Where ``cache_dir`` keeps the answers to requests made for ``user``: a directory of its own,
    named by a hash of the user id (any id, no path of it), so that a purge of the user's data drops
    them all and no other user's answer is shared, changed or timed by it."""
    return cache_dir / "users" / hashlib.sha256(user.encode()).hexdigest()[:32]


def drop_user_answers(cache_dir: Path, user: str) -> None:
    """Delete every answer ``cache_dir`` keeps for ``user``."""
    shutil.rmtree(user_answers(cache_dir, user), ignore_errors=True)


class InvalidResponse(ValueError):
    """The endpoint answered, but not with a usable result; raised by a ``parse`` callback of
    :meth:`ChatClient.complete` to have the request retried. The message is logged, so it says
    where the answer is wrong and never quotes it: an answer restates the user's turns or question,
    which a log keeps after the user is forgotten."""


class EndpointRefused(ValueError):
    """The endpoint refused a request for a reason no retry changes and every request shares: a key
    it does not take (401, 403), or a URL or model it does not have (404). Raised at once, so that
    what the endpoint was asked for is not replaced by a fallback (raw-turn records, the rule plan)."""


REFUSALS = {401: "ISQ_LLM_API_KEY (the key)", 403: "ISQ_LLM_API_KEY (the key)",
            404: "ISQ_LLM_BASE_URL and ISQ_LLM_MODEL (the endpoint and the model)"}
"""The HTTP statuses that are :class:`EndpointRefused`, with the settings each points at."""

UNRETRIED = (400, 413, 422)
"""Statuses of a request the endpoint will refuse however often it is sent (too long for the
model, a parameter it does not take): answered None at once, no retry."""

RETRY_AFTER_MAX_S = 20.0
"""The longest ``Retry-After`` of a 429 or 503 that a retry waits for (longer ones are cut to it): a
segment's extraction holds its user's ingestion lock, which a delete of the user waits for, so its
retries wait at most ``max_retries`` times this (80 s with the defaults)."""


T = TypeVar("T")


class ChatClient:
    """A client for an OpenAI-compatible ``/chat/completions`` endpoint (built on the ``openai``
    SDK), shared by the LLM extractor and the evaluation's answer stage.

    ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``), ``model`` and ``api_key`` default to the
    environment variables ISQ_LLM_BASE_URL, ISQ_LLM_MODEL and ISQ_LLM_API_KEY (the key may be
    absent for local servers: then no Authorization header is sent). ``json_mode`` asks for a raw
    JSON object answer.

    :meth:`complete` retries HTTP errors, transport errors, timeouts and answers its ``parse``
    callback rejects, with exponential backoff (``backoff_s * 2**k`` seconds, or the endpoint's
    ``Retry-After`` when longer, up to :data:`RETRY_AFTER_MAX_S`); it raises
    :class:`EndpointRefused` for a refused key, URL or model and gives up at once on a request the
    endpoint cannot take (:data:`UNRETRIED`). ``timeout_s`` bounds each wait for the endpoint (to
    connect, or for the next bytes of its answer), not a whole answer. The SDK's own retries are
    off, so ``usage.http_calls`` and ``usage.retries`` count every request sent. Answers that parse
    are cached in ``cache_dir`` under the SHA-256 of the request (endpoint, model, messages and
    parameters), so a rerun repeats no call; those of a request made for a user
    (``user``: the extractor's, planner's and consolidation's) in the user's own directory
    (:func:`user_answers`). ``usage`` accounts for every call and cache hit, and
    :meth:`usage_of` for those made for one user: what a user's own job reports, whatever other
    users' jobs share the client meanwhile.
    """

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None, *,
                 cache_dir: str | Path | None = None, temperature: float = 0.0, timeout_s: float = 120.0,
                 max_retries: int = 4, backoff_s: float = 1.0, json_mode: bool = True) -> None:
        base_url = base_url or os.environ.get("ISQ_LLM_BASE_URL")
        model = model or os.environ.get("ISQ_LLM_MODEL")
        if not base_url:
            raise ValueError("an LLM endpoint needs base_url or the environment variable ISQ_LLM_BASE_URL")
        if not model:
            raise ValueError("an LLM endpoint needs model or the environment variable ISQ_LLM_MODEL")
        _check_endpoint(base_url)
        self.endpoint = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key or os.environ.get("ISQ_LLM_API_KEY")
        # The SDK insists on a key (and would otherwise read OPENAI_API_KEY, sending a real key to
        # a local server): without one, pass a placeholder and omit its header on every request.
        self._client = openai.OpenAI(base_url=base_url, api_key=self.api_key or "no-key", max_retries=0,
                                     timeout=timeout_s)
        self.timeout_s = timeout_s
        self._headers: dict[str, Any] = {} if self.api_key else {"Authorization": openai.omit}
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if self.cache_dir is not None:
            try:
                self.cache_dir.mkdir(parents=True, exist_ok=True)
            except OSError as err:  # e.g. a file there: said as the cache's problem, not a bare errno
                said = f"the LLM answers' cache cannot be a directory there ({err.strerror})"
                raise OSError(err.errno, said, str(self.cache_dir)) from None
        self.params: dict[str, Any] = {"temperature": temperature}
        if json_mode:
            self.params["response_format"] = {"type": "json_object"}
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.usage = LLMUsage()
        self._users: dict[str, LLMUsage] = {}
        self._counting = threading.Lock()

    def usage_of(self, user: str) -> LLMUsage:
        """A copy of the accounting of the requests made for ``user`` (zeros if none)."""
        with self._counting:
            return dataclasses.replace(self._users.get(user) or LLMUsage())

    def forget_usage(self, user: str) -> None:
        with self._counting:
            self._users.pop(user, None)

    def count(self, user: str | None, **counts: int) -> None:
        """Add ``counts`` to the client's accounting and to ``user``'s."""
        with self._counting:
            tallies = [self.usage] if user is None else [self.usage, self._users.setdefault(user, LLMUsage())]
            for tally in tallies:
                for name, count in counts.items():
                    setattr(tally, name, getattr(tally, name) + count)

    def complete(self, messages: list[dict[str, str]], parse: Callable[[str], T],
                 label: str = "request", user: str | None = None) -> T | None:
        """Send ``messages`` and return ``parse(content of the first choice)``; ``None`` once the
        retries are exhausted. ``parse`` raises :class:`InvalidResponse` for an unusable answer;
        ``label`` names the request in log messages; ``user``, the user whose data the messages
        carry (its answer cached apart)."""
        payload = {"model": self.model, "messages": messages, **self.params}
        request = {"endpoint": self.endpoint, **payload}  # a model name may not say whose weights
        key = hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        path = self._entry(key, user)
        cached = self._cache_load(path)
        if cached is not None:
            try:
                result = parse(_content(cached))
            except InvalidResponse:
                logger.warning("ignoring unusable cache entry %s", key)
            else:
                prompt, completion = _tokens(cached)
                self.count(user, cache_hits=1, cached_prompt_tokens=prompt,
                            cached_completion_tokens=completion)
                return result
        wait_s = 0.0  # what the last answer asked to wait (Retry-After), for the next attempt only
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.count(user, retries=1)
                time.sleep(max(self.backoff_s * 2 ** (attempt - 1), wait_s))
                wait_s = 0.0
            self.count(user, http_calls=1)
            try:
                body = self._post(payload)
            except (openai.APIError, ValueError, TimeoutError) as err:
                logger.warning("%s attempt %d: request failed: %s", label, attempt + 1, err)
                status = err.status_code if isinstance(err, openai.APIStatusError) else None
                if status in REFUSALS:  # the message may reach a service's clients: no URL or model in it
                    logger.error("the LLM endpoint %s refused model %r: HTTP %d", redacted(self.endpoint),
                                 self.model, status)
                    raise EndpointRefused(f"the LLM endpoint refused the memory's requests (HTTP {status}): "
                                          f"check {REFUSALS[status]}") from None
                if status in UNRETRIED:
                    return None
                wait_s = _retry_after(err)
                continue
            prompt, completion = _tokens(body)
            self.count(user, prompt_tokens=prompt, completion_tokens=completion)
            try:
                result = parse(_content(body))
            except InvalidResponse as err:
                logger.warning("%s attempt %d: unusable answer: %s", label, attempt + 1, err)
                continue
            self._cache_store(path, body)
            return result
        return None

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One request; the response body as a JSON dict (the fields the endpoint sent). Raises
        ``openai.APIError`` for HTTP and transport errors, ``ValueError`` for a body that is not
        a JSON object, ``TimeoutError`` for an answer not whole within ``timeout_s``: the SDK's
        timeout bounds each read, so an endpoint sending a byte at a time held the user's
        extraction, and the deletes that wait for it, as long as it liked. Such a request is left
        to end in its own thread; nothing it brings is used."""
        outcome: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

        def send() -> None:
            try:
                answer = self._client.chat.completions.create(**payload, extra_headers=self._headers)
                outcome.put((True, answer))
            except BaseException as err:  # raised again on the caller's thread
                outcome.put((False, err))

        threading.Thread(target=send, name="llm-request", daemon=True).start()
        try:
            answered, completion = outcome.get(timeout=self.timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no whole answer within {self.timeout_s:g} s") from None
        if not answered:
            raise completion
        if not isinstance(completion, ChatCompletion):  # the SDK passes other JSON values through
            raise ValueError("response body is not a JSON object")
        return completion.model_dump(mode="json", exclude_unset=True, warnings=False)

    def _entry(self, key: str, user: str | None) -> Path | None:
        """The cache file of the request ``key`` (made for ``user``); None without a cache."""
        if self.cache_dir is None:
            return None
        return (self.cache_dir if user is None else user_answers(self.cache_dir, user)) / f"{key}.json"

    @staticmethod
    def _cache_load(path: Path | None) -> dict[str, Any] | None:
        if path is None:
            return None
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            entry = None
        if not isinstance(entry, dict):
            logger.warning("unreadable cache entry %s", path)
            return None
        return entry

    @staticmethod
    def _cache_store(path: Path | None, body: dict[str, Any]) -> None:
        """Keep ``body`` in the cache file ``path``, written then renamed, so a crash never leaves a
        truncated entry; a cache that cannot take it (a full disk) keeps nothing and says so: the
        answer, paid for, is still used."""
        if path is None:
            return
        temporary = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False,
                                             encoding="utf-8") as handle:
                temporary = handle.name
                json.dump(body, handle)
            os.replace(temporary, path)
        except OSError as err:
            logger.warning("answer not cached in %s: %s", path.parent, err)
            if temporary is not None:
                Path(temporary).unlink(missing_ok=True)


class LLMRole:
    """A part of the memory that works through an endpoint (extractor, planner, consolidation
    operator): one :class:`ChatClient` from the same options, a name that stores and reports
    record (``llm:<model>``) and the client's token accounting."""

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 **options: Any) -> None:
        self.client = ChatClient(base_url, model, api_key, **options)

    @property
    def model(self) -> str:
        return self.client.model

    @property
    def name(self) -> str:
        return f"llm:{self.client.model}"

    @property
    def usage(self) -> LLMUsage:
        return self.client.usage

    def usage_of(self, user: str) -> LLMUsage:
        return self.client.usage_of(user)

    def forget(self, user: str) -> None:
        """Drop the answers cached for ``user`` (a purge of the user's data) and the count of them."""
        self.client.forget_usage(user)
        if self.client.cache_dir is not None:
            drop_user_answers(self.client.cache_dir, user)


def _retry_after(err: Exception) -> float:
    """The seconds a 429 or 503 answer asks to wait before the next request (its ``Retry-After``,
    in seconds, at most :data:`RETRY_AFTER_MAX_S`); 0 for any other failure."""
    if not isinstance(err, openai.APIStatusError) or err.status_code not in (429, 503):
        return 0.0
    try:
        seconds = float(err.response.headers.get("retry-after", "0"))
    except ValueError:  # an HTTP date: the backoff applies
        return 0.0
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S) if seconds == seconds else 0.0


def _check_endpoint(base_url: str) -> None:
    """Refuse a base URL that is not an http(s) URL with a host (ValueError naming it), before the
    SDK's HTTP library raises its own error type for it."""
    shown = redacted(base_url)
    try:
        parts = urlsplit(base_url)
        parts.port  # noqa: B018 - reading it checks the port
    except ValueError as err:  # its message may quote a password read as a port: said only without one
        why = "" if shown != base_url else f": {err}"
        raise ValueError(f"the LLM endpoint base_url (ISQ_LLM_BASE_URL) {shown!r} is not a URL"
                         f"{why}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the LLM endpoint base_url (ISQ_LLM_BASE_URL) {shown!r} is not an http(s) URL "
                         "with a host")


def one_line(text: str) -> str:
    """``text`` as one line of a prompt, its line breaks made spaces: a text quoted line by line
    (a turn, a record) cannot start a line of its own that reads as another turn or record."""
    return " ".join(text.splitlines())


def json_answer(content: str, validator: Draft202012Validator) -> Any:
    """The JSON value of an answer, checked against ``validator``; a markdown code fence around it
    is removed (some models add one despite the instruction). :class:`InvalidResponse` says what
    is wrong, so the request is retried: JSON that is malformed, or that the memory would refuse in
    a request (:mod:`retrieval.memory.strict_json`: a key given twice, nesting too deep, a number
    too long to read)."""
    try:
        answer = strict_json.loads(re.sub(r"^\s*```(?:json)?\s*|\s*```\s*$", "", content))
    except json.JSONDecodeError as err:
        raise InvalidResponse(f"content is not JSON: {err}") from None
    except strict_json.JSONRefused as err:
        raise InvalidResponse(f"content: {err}") from None
    error = best_match(validator.iter_errors(answer))
    if error is not None:
        where = "/".join(str(part) for part in error.path) or "(root)"
        expected = f" {error.validator_value!r}" if error.validator == "type" else ""
        raise InvalidResponse(f"schema violation at {where}: fails {error.validator!r}{expected}")
    _storable(answer)
    return answer


def _storable(value: Any, where: str = "") -> None:
    """Refuse a string of the answer that no store keeps: one holding a NUL character (PostgreSQL
    text cannot, and the memory refuses it in input) or a lone surrogate (not UTF-8), both of which
    JSON can spell (``\\u0000``, ``\\ud800``)."""
    if isinstance(value, str):
        at, place = lone_surrogate(value), where or "(root)"
        if at is not None:
            raise InvalidResponse(f"{place}: not valid Unicode (a lone surrogate at character {at})")
        if "\0" in value:
            raise InvalidResponse(f"{place}: a NUL character")
    elif isinstance(value, dict):
        for key, item in value.items():
            _storable(key, where)
            _storable(item, f"{where}/{key}".lstrip("/"))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _storable(item, f"{where}/{index}".lstrip("/"))


def _content(body: dict[str, Any]) -> str:
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise InvalidResponse("no choices[0].message.content in the response") from None
    if content is not None and not isinstance(content, str):
        raise InvalidResponse("choices[0].message.content is not a string")
    return content or ""


def _tokens(body: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens from an OpenAI-style ``usage`` block; 0 where absent or malformed
    (not a whole number, or negative)."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    counts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    return tuple(value if isinstance(value, int) and value >= 0 else 0  # type: ignore[return-value]
                 for value in counts)
