"""Evidence keys (docs/design.md §7.1): day keys up to 14 days, no entity-topic node of one key,
the first spelling of a key as its text."""

from __future__ import annotations

from retrieval.memory.evidence_keys import record_nodes, temporal_keys
from retrieval.memory.records import AMU, SourcePointer


def _amu(entities=(), tags=()):
    return AMU(
        "u:1",
        "Jon DeLuca took a pottery class.",
        "fact",
        SourcePointer("u", "s", ("t1",), ("Jon",), 0),
        entities=tuple(entities),
        tags=tuple(tags),
    )


def test_a_value_of_fifteen_days_gets_month_keys_only():
    """Day keys are given to a value covering at most MAX_DAY_KEYS = 14 days; 14 days get day
    keys, 15 only the month's (``<=`` gives a 15-day value fifteen day nodes)."""
    assert len(temporal_keys(["2023-05-01/2023-05-14"])) == 14 + 1
    assert temporal_keys(["2023-05-01/2023-05-15"]) == ["2023-05"]


def test_an_entity_and_a_tag_of_one_key_make_no_entity_topic_node():
    """An entity-topic node pairs an entity with a *different* topic; "pottery" as entity and
    tag would otherwise make a node "pottery|pottery" that duplicates the entity node."""
    names = [node.name for node in record_nodes(_amu(entities=("Pottery", "Jon DeLuca"), tags=("pottery",)))]
    assert "entity_topic:pottery|pottery" not in names
    assert "entity_topic:jon deluca|pottery" in names


def test_the_first_spelling_of_a_key_is_its_text():
    """Keys that normalise alike keep the first spelling as the node's text ("first occurrence
    kept"); without the check the last spelling overwrites it."""
    [entity] = [
        n for n in record_nodes(_amu(entities=("Jon DeLuca", "jon deluca"))) if n.node_type == "entity"
    ]
    assert (entity.key, entity.text) == ("jon deluca", "Jon DeLuca")
