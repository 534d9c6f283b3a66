"""The token accounting of LLM calls (:class:`LLMUsage`): what the client counts, and what the
extractor, consolidation and the evaluation report."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class LLMUsage:
    """Token accounting. ``prompt_tokens`` / ``completion_tokens`` sum the ``usage`` of every HTTP
    response (what the endpoint billed); ``cached_*`` sum the usage recorded with cache hits, so
    ``prompt_tokens + cached_prompt_tokens`` is the construction cost of the memory."""

    http_calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    fallback_segments: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cached_completion_tokens: int = 0

    @property
    def calls(self) -> int:
        """Requests answered, from the endpoint or the cache (a hit stands for a call an earlier run paid
        for)."""
        return self.http_calls + self.cache_hits

    @property
    def tokens(self) -> int:
        """Prompt and completion tokens, billed now or recorded with cache hits."""
        return (self.prompt_tokens + self.completion_tokens + self.cached_prompt_tokens
                + self.cached_completion_tokens)

    def __add__(self, other: LLMUsage) -> LLMUsage:
        return LLMUsage(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(LLMUsage)})

    def since(self, before: LLMUsage) -> LLMUsage:
        """This minus ``before``, field by field: one run's share of running totals."""
        return LLMUsage(**{f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(LLMUsage)})
