"""The LLM planner (LycheeMemory section 3.5, appendix F.2): one call per question, temperature
0, a raw JSON plan validated against :data:`retrieval.multi_route.query_plan.PLAN_SCHEMA`, through the
project's one client (:class:`retrieval.llm_client.ChatClient`: retries, on-disk cache, token
accounting). A question whose plan cannot be had (endpoint down or refusing, answers that never
validate) gets the rule planner's plan, and ``fallbacks`` counts it: a search is answered whatever
the endpoint does, and its plan's source says which planner made it."""

from __future__ import annotations

import logging
from typing import Any

from retrieval.contract import check_query
from retrieval.llm_client import EndpointRefused, InvalidResponse, LLMRole, json_answer, one_line
from retrieval.multi_route.params import MAX_ROUTES, QUESTION_TYPES
from retrieval.multi_route.planner_rules import PlanContext, RulePlanner
from retrieval.multi_route.query_plan import PLAN_VALIDATOR, Plan, PlanError

logger = logging.getLogger(__name__)

PLANNER_PROMPT = f"""You turn a question about a long conversation into a retrieval plan for a memory store.
Describe only the evidence the question needs; do not decide whether the answer exists and do not
invent answer candidates. Return only a JSON object, without markdown fences:
{{"question_type": "...", "routes": [{{"goal": "...", "queries": ["..."], "entities": ["..."],
  "topics": ["..."], "time": {{"start": "...", "end": "..."}} or null}}]}}
question_type is one of: {", ".join(QUESTION_TYPES)}.
Use a single route for an ordinary factual question about a named person; use several routes (at most
{MAX_ROUTES}) only when the question explicitly needs separate evidence (e.g. a comparison of two people).
queries: one to four search queries for the route; entities: names of people, places or things the
evidence must mention; topics: short topic words; time: the ISO 8601 range (YYYY, YYYY-MM or
YYYY-MM-DD; start = end for one date) that the evidence must fall in, resolved against the date of
the conversation's latest session, or null when the question sets no time."""


class LLMPlanner(LLMRole):
    """Plans through an OpenAI-compatible endpoint (keyword options are :class:`ChatClient`'s;
    JSON mode and temperature 0 are its defaults)."""

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 **options: Any) -> None:
        super().__init__(base_url, model, api_key, **options)
        self.fallback = RulePlanner()
        self.fallbacks = 0

    def messages(self, question: str, context: PlanContext) -> list[dict[str, str]]:
        lines = []
        if context.now is not None:
            lines.append(f"Latest session date: {context.now:%A, %d %B %Y}")
        if context.participants:
            lines.append("Participants: " + ", ".join(context.participants))
        lines += ["", f"Question: {one_line(question)}"]
        return [{"role": "system", "content": PLANNER_PROMPT}, {"role": "user", "content": "\n".join(lines)}]

    def plan(self, question: str, context: PlanContext) -> Plan:
        check_query(question)
        try:
            plan = self.client.complete(self.messages(question, context), self._parse,
                                        label="plan", user=context.user)
            why = "no valid answer"
        except EndpointRefused as err:
            plan, why = None, str(err)
        if plan is not None:
            return plan
        self.fallbacks += 1
        logger.warning("no plan for a question (%s): using the rule planner", why)
        return self.fallback.plan(question, context)

    def _parse(self, content: str) -> Plan:
        try:
            return Plan.from_dict(json_answer(content, PLAN_VALIDATOR), self.name)
        except PlanError as err:
            raise InvalidResponse(f"plan field {err.field!r} is not a valid value") from None
