"""Plan-guided multi-route retrieval (docs/design.md §7): each channel on a small synthetic store with
known answers, the planners and the plan schema, RRF, s_final and MMR against hand-computed
values, the reranker and the retriever's guarantees (exactly k distinct items, no archived one)."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest

from retrieval.contract import EmptyQuery, Query
from retrieval.llm_usage import LLMUsage
from retrieval.memory.records import Turn
from retrieval.memory.store import AMUStore
from retrieval.multi_route import channels, planner_rules
from retrieval.multi_route.fusion import final_scores, ranking, rrf, stand_in
from retrieval.multi_route.planner_llm import LLMPlanner
from retrieval.multi_route.planner_rules import RulePlanner, question_type
from retrieval.multi_route.query_plan import Plan, PlanError, Route, TimeConstraint
from retrieval.multi_route.retriever import RERANKER_OFF, MultiRouteRetriever
from retrieval.multi_route.selection import SimilarityColumns, mmr_select, similarity
from tests.fake_chat import FakeChatServer, completion_body
from tests.multi_route_fixtures import ARCHIVED, CID, build_store, open_bank


@pytest.fixture
def bank(tmp_path):
    build_store(tmp_path / "store")
    store = AMUStore(tmp_path / "store")
    yield open_bank(store)
    store.close()


def vector(bank, text):
    return bank.embedder.encode([text])[0]


def ids(bank, ranked) -> list[str]:
    return [bank.item_id(int(i)) for i in ranked.items]


# -- channels ------------------------------------------------------------------------------------


def test_each_channel_finds_its_known_answer(bank):
    assert len(bank.records) == 5 and all(amu.id != ARCHIVED for amu in bank.records)
    assert ids(bank, channels.record_recall(bank, vector(bank, "pottery class"), 3))[0] == f"{CID}:0:0"
    turns = channels.turn_recall(bank, vector(bank, "cool wow"), 2)
    assert ids(bank, turns)[0] == f"{CID}:turn:D1:3"  # small talk: no record, the raw turn itself
    merged = channels.turn_recall(bank, vector(bank, "dog Biscuit learned to sit"), 1)
    assert ids(bank, merged) == [f"{CID}:1:0"]  # a turn that is a record's whole provenance is that record
    camping = channels.turn_recall(bank, vector(bank, "go camping in July"), 1)
    assert ids(bank, camping) == [f"{CID}:turn:D2:3"]  # one turn of a two-turn record stays a turn
    assert ids(bank, channels.lexical_recall(bank, "charities", 5)) == [f"{CID}:0:1"]  # FTS5 porter stem
    nodes = channels.node_recall(bank, Route("g", ("whose dog",), ("Biscuit",)), vector(bank, "whose dog"), 5)
    assert ids(bank, nodes)[0] == f"{CID}:1:0" and "entity:biscuit" in nodes.via[int(nodes.items[0])]
    exact = channels.temporal_recall(bank, TimeConstraint("2023-05-07", "2023-05-07"), vector(bank, "x"), 10)
    assert ids(bank, exact)[0] == f"{CID}:0:0"  # the archived record of that day is not there
    assert set(ids(bank, exact)) == {f"{CID}:0:0"}
    may = channels.temporal_recall(bank, TimeConstraint("2023-05", "2023-05"), vector(bank, "race"), 10)
    assert ids(bank, may) == [f"{CID}:0:1", f"{CID}:0:0"]
    july = channels.temporal_recall(bank, TimeConstraint("2023-07-14", "2023-07-14"), vector(bank, "x"), 10)
    # month only
    assert ids(bank, july) == [f"{CID}:1:2"] and july.via[int(july.items[0])] == ("temporal:2023-07",)
    code = channels.code_recall(bank, bank.fingerprinter.fingerprint(["Yosemite camping"])[0].codes, 2)
    assert ids(bank, code)[0] == f"{CID}:1:2"
    everything = [ranked for ranked in (channels.lexical_recall(bank, "pottery archived records hates", 9),
                                        channels.record_recall(bank, vector(bank, "Ann hates pottery"), 9))]
    assert all(ARCHIVED not in ids(bank, ranked) for ranked in everything)


def test_a_session_scope_applies_before_the_node_channels_cut(bank, monkeypatch):
    """One semantic node match allowed: without a scope it is the nearest node of all (session 1's
    "pottery"); scoped to session 2 it is the nearest node with a session-2 record, not a node of
    session 1 that would take the one place and reach nothing in scope."""
    monkeypatch.setattr(channels, "NODE_MATCHES", 1)
    route, query = Route("g", ("pottery class",)), vector(bank, "pottery class")
    assert ids(bank, channels.node_recall(bank, route, query, 5)) == [f"{CID}:0:0"]
    scope = bank.session_mask("session_2")
    scoped = ids(bank, channels.node_recall(bank, route, query, 5, scope))
    assert scoped and all(item.startswith(f"{CID}:1:") for item in scoped)


# -- planning ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("question", "kind"), [
    ("When did Ann sign up for the pottery class?", "temporal"),
    ("How long has Bob had his dog?", "temporal"),
    ("What activities does Ann partake in?", "aggregate"),
    ("What books has Melanie read?", "aggregate"),
    ("What do Ann and Bob both enjoy?", "comparison"),
    ("Would Ann likely enjoy a museum visit?", "personalized_advice"),
    ("What did you recommend earlier?", "prior_assistant_response"),
    ("What is the name of Bob's dog?", "single"),
])
def test_question_types_from_the_wording(question, kind):
    assert question_type(question) == kind


def test_the_rule_planner(bank):
    planner = RulePlanner()
    plan = planner.plan("When did ann go to the POTTERY class?", bank.context)
    (route,) = plan.routes
    assert (plan.question_type == "temporal" and route.entities == ("ann",)
            and route.topics == ("pottery", "class"))
    assert route.queries == ("When did ann go to the POTTERY class?",) and route.time is None
    dated = planner.plan("What did Bob do in May 2023?", bank.context).routes[0]
    assert dated.time == TimeConstraint("2023-05", "2023-05") and dated.entities == ("bob",)
    relative = planner.plan("What did Ann paint yesterday?", bank.context)  # now = the latest session
    assert (relative.question_type == "temporal"
            and relative.routes[0].time == TimeConstraint("2023-06-19", "2023-06-19"))
    both = planner.plan("What do Ann and Bob both like about Yosemite?", bank.context)
    assert both.question_type == "comparison" and [r.entities for r in both.routes] == [
        ("ann", "bob", "yosemite"), ("ann",), ("bob",), ("yosemite",)]
    with pytest.raises(EmptyQuery):
        planner.plan("  ?! ", bank.context)


def test_the_speakers_keys_are_the_users_context_own(bank):
    """Speakers' names are never topics; their keys are kept with the user's context (dropped with
    it), not in a process-wide cache that outlived a forget and served every user of those names."""
    assert not hasattr(planner_rules, "participant_keys")
    assert bank.context.participant_keys == frozenset({"ann", "bob"})
    other = dataclasses.replace(bank.context, participants=("Pottery",))
    assert other.participant_keys == frozenset({"pottery"})
    assert RulePlanner().plan("When did ann go to the POTTERY class?", other).routes[0].topics == ("class",)


def test_the_plan_schema_round_trips_and_names_bad_fields():
    plan = Plan("comparison",
                (Route("g", ("q1", "q2"), ("ann",), ("dog",), TimeConstraint("2023-05", "2023-06")),))
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict())), "rule") == plan
    good = {"question_type": "single", "routes": [{"goal": "g", "queries": ["q"]}]}
    assert Plan.from_dict(good, "x").routes[0] == Route("g", ("q",))
    for bad, field in [({**good, "question_type": "opinion"}, "question_type"),
                       ({**good, "routes": []}, "routes"),
                       ({"question_type": "single", "routes": [{"goal": "g", "queries": []}]},
                        "routes/0/queries"),
                       ({"question_type": "single", "routes": [{"goal": "g", "queries": ["q"],
                                                                "time": {"start": "May", "end": "2023"}}]},
                        "routes/0/time")]:
        with pytest.raises(PlanError, match=f"'{field}'"):
            Plan.from_dict(bad, "x")


def test_the_llm_planner_through_the_one_client(bank, tmp_path):
    answer = {"question_type": "temporal", "routes": [{"goal": "when", "queries": ["Ann pottery class"],
                                                       "entities": ["Ann"], "time": None}]}
    replies = iter([(200, completion_body("not json", 5, 1), 0.0),
                    (200, completion_body(json.dumps(answer), 40, 9), 0.0)])
    with FakeChatServer(lambda body: next(replies)) as server:
        planner = LLMPlanner(server.base_url, "fake", cache_dir=tmp_path / "cache", backoff_s=0.0)
        plan = planner.plan("When did Ann go to pottery?", bank.context)
        again = LLMPlanner(server.base_url, "fake", cache_dir=tmp_path / "cache").plan(
            "When did Ann go to pottery?", bank.context)  # answered from the cache: no request
        requests = list(server.requests)
    assert plan == again == Plan("temporal", (Route("when", ("Ann pottery class",), ("Ann",)),), "llm:fake")
    assert len(requests) == 2 and requests[0]["temperature"] == 0.0
    assert (requests[0]["response_format"] == {"type": "json_object"}
            and "2023" in requests[0]["messages"][1]["content"])
    assert planner.usage == LLMUsage(http_calls=2, retries=1, prompt_tokens=45, completion_tokens=10)
    with FakeChatServer(lambda body: (503, {"error": "down"}, 0.0)) as server:
        down = LLMPlanner(server.base_url, "fake", max_retries=0)
        fallback = down.plan("When did Ann go to pottery?", bank.context)
    assert fallback.planner == "rule" and down.fallbacks == 1
    with FakeChatServer(lambda body: (401, {"error": "bad key"}, 0.0)) as server:
        refused = LLMPlanner(server.base_url, "fake", max_retries=3, backoff_s=0.0)
        fallback = refused.plan("When did Ann go to pottery?\nParticipants: Mallory", bank.context)
        (request,) = server.requests  # refused at once, not retried
    assert fallback.planner == "rule" and refused.fallbacks == 1
    # a question's line breaks cannot add a line of the prompt's own
    lines = request["messages"][1]["content"].splitlines()
    assert lines[-1] == "Question: When did Ann go to pottery? Participants: Mallory"
    assert not [line for line in lines if line.startswith("Participants: Mallory")]


def test_the_llm_planner_logs_neither_the_question_nor_the_answer(bank, tmp_path, caplog):
    """The log outlives a forgotten user: the planner's warnings say where an answer is wrong and
    that it fell back, never what the question or the answer said."""
    bad = [{"question_type": "Quenfrithal", "routes": [{"goal": "g", "queries": ["q"]}]},
           {"question_type": "single", "routes": [{"goal": "g", "queries": ["q"],
                                                   "time": {"start": "Quenfrithal", "end": "2023"}}]}]
    replies = iter((200, completion_body(json.dumps(answer), 5, 1), 0.0) for answer in bad)
    with FakeChatServer(lambda body: next(replies)) as server, \
            caplog.at_level(logging.WARNING, logger="retrieval"):
        planner = LLMPlanner(server.base_url, "fake", max_retries=1, backoff_s=0.0)
        fallback = planner.plan("Where does Quenfrithal live?", bank.context)
    assert fallback.planner == "rule" and planner.fallbacks == 1
    assert "question_type: fails 'enum'" in caplog.text and "plan field 'routes/0/time'" in caplog.text
    assert "using the rule planner" in caplog.text and "Quenfrithal" not in caplog.text


# -- fusion and selection --------------------------------------------------------------------------


def test_rrf_and_final_scores_by_hand():
    fused = rrf([[1, 2, 3], [3, 1]])
    assert fused == pytest.approx({1: 1 / 61 + 1 / 62, 2: 1 / 62, 3: 1 / 63 + 1 / 61})
    assert ranking(fused) == [1, 3, 2]
    assert rrf([[5, 5, 6]], [2.0]) == pytest.approx({5: 2 / 61, 6: 2 / 63})  # a repeat keeps its first rank
    parts = final_scores([[1, 2, 3], [3, 1]])
    top = 1 / 61 + 1 / 62
    assert parts[1].s_best == 1.0 and parts[1].s_route == 1.0 and parts[1].s_final == pytest.approx(1.0)
    assert parts[3].s_best == 1.0 and parts[3].s_route == pytest.approx((1 / 63 + 1 / 61) / top)
    assert parts[2].s_final == pytest.approx(0.82 * 61 / 62 + 0.18 * (1 / 62) / top)


def test_an_open_turn_stands_in_at_its_raw_turn_rank_by_hand():
    fused = {1: 1 / 61, 7: 1 / 61}
    stand_in(fused, [7, 1, 8, 7], 3.0, lambda item: item in (7, 8))
    assert fused == pytest.approx({1: 1 / 61, 7: 1 / 61 + 3 / 61, 8: 3 / 63})  # a repeat adds once


def test_mmr_by_hand():
    a = {"turns": frozenset({"D1:1"}), "tokens": frozenset({"pottery", "class"})}
    b = {"turns": frozenset({"D1:1"}), "tokens": frozenset({"pottery", "lesson"})}
    c = {"turns": frozenset({"D2:1"}), "tokens": frozenset({"dog"})}
    assert similarity(a, b) == pytest.approx((1 + 1 / 3) / 2) and similarity(a, c) == 0.0
    relevance = {1: 1.0, 2: 0.95, 3: 0.8}
    # after 1: item 2 scores 0.75*0.95 - 0.25*2/3 = 0.546, item 3 scores 0.75*0.8 = 0.6
    assert mmr_select([1, 2, 3], relevance, {1: a, 2: b, 3: c}, 3) == [1, 3, 2]
    assert mmr_select([1, 2, 3], relevance, {1: a, 2: b, 3: c}, 2, seeds=[2]) == [2, 3]
    assert mmr_select([1, 2], {1: 0.5, 2: 0.5}, {1: c, 2: c}, 2) == [1, 2]  # ties: the earlier one
    # s_sim is the greatest similarity to any item selected, not to the last one: after 1 and 3,
    # item 2 (like 1) scores 0.75*0.9 - 0.25*2/3 = 0.508, below item 4's 0.75*0.7 = 0.525
    d = {"turns": frozenset({"D3:1"}), "tokens": frozenset({"kite"})}
    later = {1: 1.0, 2: 0.9, 3: 0.95, 4: 0.7}
    assert mmr_select([1, 2, 3, 4], later, {1: a, 2: b, 3: c, 4: d}, 4) == [1, 3, 4, 2]


# -- the retriever -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "use_code"), [(3, False), (8, True), (30, True)])
def test_exactly_k_distinct_items_and_never_an_archived_one(bank, k, use_code):
    assert bank.size == 5 + 7 and int((bank.turn_record < 0).sum()) == 3  # D1:3, D2:3, D2:4 stay turns
    result = MultiRouteRetriever(bank, use_code=use_code, plan_depth=0).retrieve(
        Query("What did Ann do with pottery?"), k)
    hit_ids = [hit.id for hit in result.hits]
    assert len(hit_ids) == len(set(hit_ids)) == min(k, 8) and ARCHIVED not in hit_ids
    assert [hit.rank for hit in result.hits] == list(range(1, len(hit_ids) + 1))
    assert result.reranker == RERANKER_OFF and ("code" in result.hits[0].scores) == use_code


def test_a_retrieval_splits_its_time_into_encode_routes_and_fusion(bank):
    result = MultiRouteRetriever(bank, use_code=True, plan_depth=0).retrieve(Query("pottery class"), 4)
    assert set(result.timings) == {"model_wait", "encode", "routes", "fusion"}
    assert result.timings["model_wait"] == 0.0  # no batcher: nothing queued for the model
    assert all(seconds >= 0 for seconds in result.timings.values())
    assert sum(result.timings.values()) == pytest.approx(result.seconds, abs=1e-3)


def test_a_session_mask_is_the_items_of_that_session_also_after_growth(bank):
    def by_text(session):
        return [amu.source.session_id == session for amu in bank.records] + [
            turn.session_id == session for turn in bank.turns]

    assert bank.session_mask("session_2").tolist() == by_text("session_2") and any(by_text("session_2"))
    assert not bank.session_mask("no such session").any()
    bank.add_turns([Turn(CID, "session_3", "D3:1", "Ann", "A new session begins.")])
    new = bank.session_mask("session_3").tolist()
    assert new == by_text("session_3") == [False] * (bank.size - 1) + [True]
    assert bank.session_mask("session_1").tolist() == by_text("session_1")


def test_an_open_turn_stands_in_for_its_records_until_its_segment_commits(bank):
    """A turn no segment covers yet is listed by the raw-turn channel alone; open, it ranks as if
    its records were listed where it is, so the record channels' favourites do not bury it."""
    assert not bank.open_turns.any()  # every stored turn is in a committed segment
    bank.add_turns([Turn(CID, "session_3", "D3:1", "Bob", "Biscuit the dog learned to roll over.")])
    assert bank.open_turns.tolist() == [False] * 7 + [True]
    retriever = MultiRouteRetriever(bank, use_code=True, plan_depth=0)
    question = Query("Which dog learned to roll over?")
    opened = [hit.id for hit in retriever.retrieve(question, 3).hits]
    bank.close_turns(["D3:1"])
    closed = [hit.id for hit in retriever.retrieve(question, 3).hits]
    fresh = f"{CID}:turn:D3:1"
    assert opened[0] == fresh and fresh not in closed, (opened, closed)
    assert closed[0] == f"{CID}:1:0"  # the record several channels list: the turn's rival


def test_open_small_talk_does_not_stand_in_for_records_it_will_not_have(bank):
    """An open turn of small talk will have no record (the extractors skip it): it ranks as a
    closed turn does, while an open turn with content stands in."""
    bank.add_turns([Turn(CID, "session_3", "D3:1", "Bob", "Wow, pottery!"),
                    Turn(CID, "session_3", "D3:2", "Ann", "Biscuit the dog learned to roll over.")])
    first_turn = len(bank.records)
    assert [bank.stands_in(first_turn + j) for j in range(len(bank.turns))] == [False] * 7 + [False, True]
    assert not bank.stands_in(0)  # a record
    retriever = MultiRouteRetriever(bank, use_code=True, plan_depth=0)
    question = Query("pottery")
    opened = [(hit.id, hit.score) for hit in retriever.retrieve(question, 5).hits]
    bank.close_turns(["D3:1"])
    closed = [(hit.id, hit.score) for hit in retriever.retrieve(question, 5).hits]
    assert opened == closed and opened[0][0] == f"{CID}:0:0" and f"{CID}:turn:D3:1" in dict(opened), opened


def test_the_final_top_k_is_at_least_the_plan_depth(bank):
    default = MultiRouteRetriever(bank).retrieve(Query("pottery"), 3)
    assert len(default.hits) == 8  # final top-k = max(3, plan_depth 15, 1), capped by the bank


def test_a_record_hit_carries_its_provenance_and_channel_scores(bank):
    retriever = MultiRouteRetriever(bank, plan_depth=0)
    first = retriever.retrieve(Query("When did Ann sign up for the pottery class?"), 4).hits[0]
    assert (first.id, first.kind, first.time, first.turns) == (f"{CID}:0:0", "record", "2023-05-07",
                                                              ("D1:1",))
    assert {"records", "lexical", "nodes", "s_final"} <= set(first.scores) and first.route_indices == (0,)


def test_a_raw_turn_hit_has_no_memory_type(bank):
    retriever = MultiRouteRetriever(bank, plan_depth=0)
    turn = next(h for h in retriever.retrieve(Query("cool wow"), 8).hits if h.kind == "turn")
    assert turn.memory_type is None and turn.turns[0] in ("D1:3", "D2:3", "D2:4")


def test_a_tiny_random_cross_encoder_reranks_inside_routes(bank, tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from isq.encoder import MINILM_ALIAS, resolve_encoder_path
    from retrieval.multi_route.rerank import CrossEncoderReranker, rerank

    tokenizer = AutoTokenizer.from_pretrained(resolve_encoder_path(MINILM_ALIAS))
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16,
                                                     num_hidden_layers=1, num_attention_heads=2,
                                                     intermediate_size=32, num_labels=1))
    model.save_pretrained(tmp_path / "ce")
    tokenizer.save_pretrained(tmp_path / "ce")
    reranker = CrossEncoderReranker(tmp_path / "ce")
    scores = reranker.scores("pottery", ["Ann signed up for a pottery class.", "Bob ran a race."])
    assert scores.shape == (2,) and np.isfinite(scores).all()
    assert rerank([7, 8, 9], np.array([0.1, 0.5, 0.1])) == [8, 7, 9]
    result = MultiRouteRetriever(bank, reranker=reranker, plan_depth=0).retrieve(Query("pottery class"), 5)
    assert result.reranker == str(tmp_path / "ce") and len(result.hits) == 5
    with pytest.raises(FileNotFoundError, match="no such model directory"):
        CrossEncoderReranker(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: not a sentence-transformers cross-encoder"):
        CrossEncoderReranker(tmp_path / "empty")


def test_the_similarity_columns_are_the_pairwise_definition():
    rng = np.random.default_rng(0)
    fields = ("session", "turns", "tokens", "nodes")
    signatures = {i: {f: frozenset(map(str, rng.choice(6, size=rng.integers(0, 4), replace=False)))
                      for f in fields if rng.random() < 0.8} for i in range(12)}
    columns = SimilarityColumns(list(range(12)), signatures)
    matrix = np.stack([columns.column(b) for b in range(12)], axis=1)
    expected = [[similarity(signatures[a], signatures[b]) for b in range(12)] for a in range(12)]
    np.testing.assert_allclose(matrix, expected)


def test_ranking_breaks_ties_by_item_ascending() -> None:
    fused = rrf([[7, 4], [2]])  # 7 and 2 each first in one list: equal support
    assert fused[7] == fused[2] and ranking(fused) == [2, 7, 4]


def test_a_seed_that_several_routes_found_is_selected_once() -> None:
    signatures = {item: {"tokens": frozenset({str(item)})} for item in (1, 2, 3)}
    assert mmr_select([1, 2, 3], {1: 0.9, 2: 0.8, 3: 0.7}, signatures, 3, seeds=[1, 1, 2]) == [1, 2, 3]


def test_a_scoped_search_never_fills_its_list_from_outside_the_scope(bank) -> None:
    scope = bank.session_mask("session_2")
    result = MultiRouteRetriever(bank, plan_depth=0).retrieve(Query("pottery class"), 12, scope=scope)
    assert result.hits and len(result.hits) <= int(scope.sum())
    assert {hit.session_id for hit in result.hits} == {"session_2"}


def test_mmr_chooses_among_the_top_rerank_limit_candidates_not_the_top_k(bank, monkeypatch) -> None:
    from retrieval.multi_route import retriever as retriever_module
    from retrieval.multi_route.params import rerank_limit

    pools = []

    def spy(pool, relevance, signatures, k, seeds=()):
        pools.append((list(pool), len(relevance)))
        return mmr_select(pool, relevance, signatures, k, seeds)

    monkeypatch.setattr(retriever_module, "mmr_select", spy)
    MultiRouteRetriever(bank, plan_depth=0).retrieve(Query("What did Ann do with pottery?"), 3)
    [(pool, scored)] = pools
    assert scored > 3 and len(pool) == min(scored, rerank_limit(3))
