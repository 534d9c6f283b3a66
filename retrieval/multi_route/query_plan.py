"""The retrieval plan (LycheeMemory eq. 8; docs/design.md §7.2): a question type and routes, each a
goal, search queries, structured constraints (entities, topics) and an optional temporal
constraint. Both planners produce it; its JSON form is validated against :data:`PLAN_SCHEMA`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from retrieval.memory.times import time_interval
from retrieval.multi_route.params import MAX_ROUTES, QUESTION_TYPES


class PlanError(ValueError):
    """A plan does not satisfy the schema; the message names the field, and so does ``field``
    alone (for a message that must not quote the value)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}}
_TIME = {"type": ["object", "null"], "required": ["start", "end"], "additionalProperties": False,
         "properties": {"start": {"type": "string"}, "end": {"type": "string"}}}

PLAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["question_type", "routes"],
    "properties": {
        "question_type": {"enum": list(QUESTION_TYPES)},
        "routes": {
            "type": "array", "minItems": 1, "maxItems": MAX_ROUTES,
            "items": {
                "type": "object",
                "required": ["goal", "queries"],
                "properties": {
                    "goal": {"type": "string"},
                    "queries": {**_STRINGS, "minItems": 1, "maxItems": 4},
                    "entities": _STRINGS,
                    "topics": _STRINGS,
                    "time": _TIME,
                },
            },
        },
    },
}
"""JSON schema of a plan (the LLM planner's answer and :meth:`Plan.to_dict`). Times are ISO 8601
values of :func:`retrieval.memory.times.time_interval` (``2023-05-07``, ``2023-05``, ``2023``...)."""

PLAN_VALIDATOR = Draft202012Validator(PLAN_SCHEMA)


@dataclass(frozen=True)
class TimeConstraint:
    """A closed time range of ISO values; ``start == end`` is one exact date (or month, year)."""

    start: str
    end: str

    def __post_init__(self) -> None:
        low, high = time_interval(self.start)[0], time_interval(self.end)[1]
        if high < low:
            raise ValueError(f"time range {self.start}..{self.end} ends before it starts")


@dataclass(frozen=True)
class Route:
    """One evidence route R_j = (goal, queries, constraints, temporal constraint)."""

    goal: str
    queries: tuple[str, ...]
    entities: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    time: TimeConstraint | None = None


@dataclass(frozen=True)
class Plan:
    """Π(q) = (question type, routes); ``planner`` says which planner made it."""

    question_type: str
    routes: tuple[Route, ...]
    planner: str = "rule"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (:data:`PLAN_SCHEMA`, plus ``planner``)."""
        return {"question_type": self.question_type, "planner": self.planner, "routes": [
            {"goal": r.goal, "queries": list(r.queries), "entities": list(r.entities),
             "topics": list(r.topics),
             "time": None if r.time is None else {"start": r.time.start, "end": r.time.end}}
            for r in self.routes]}

    @classmethod
    def from_dict(cls, value: Any, planner: str) -> Plan:
        """Validate a JSON plan; :class:`PlanError` names the first field at fault."""
        error = best_match(PLAN_VALIDATOR.iter_errors(value))
        if error is not None:
            where = "/".join(str(part) for part in error.path) or "(plan)"
            raise PlanError(f"plan field {where!r}: {error.message}", where)
        routes = []
        for number, route in enumerate(value["routes"]):
            time = route.get("time")
            try:
                constraint = None if time is None else TimeConstraint(time["start"], time["end"])
            except ValueError as err:
                where = f"routes/{number}/time"
                raise PlanError(f"plan field {where!r}: {err}", where) from None
            routes.append(Route(route["goal"], tuple(route["queries"]), tuple(route.get("entities", ())),
                                tuple(route.get("topics", ())), constraint))
        return cls(value["question_type"], tuple(routes), planner)
