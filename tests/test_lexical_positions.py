"""The lexical channel's positions, prefixes and ties: a record added later takes the next
position, exclusions do not shorten a result, a lone CJK character finds the word it ends, equal
scores rank in insertion order; BM25 over codes keeps its parameters and bounds its codes."""

from __future__ import annotations

import numpy as np

from retrieval.index.code_bm25 import CodeBM25
from retrieval.index.fts import CONNECTION_BYTES, FTSIndex, RecordLexical


def test_a_lone_cjk_character_that_ends_a_run_finds_its_record():
    """The indexed side writes a run's last character as its own token, so a one-character
    query (a prefix query) finds a record whose word ends with it: without that token "子" (the
    end of 饺子, sentence-final) finds nothing."""
    index = FTSIndex()
    index.add(["我在北京喜欢吃饺子", "Ann likes Tokyo."])
    positions, _ = index.search("子", 5)
    assert list(positions) == [0]


def _amu(i: int, text: str):
    from retrieval.memory.records import AMU, SourcePointer

    return AMU(f"u:{i}", text, "fact", SourcePointer("u", "s", (f"t{i}",), ("Ann",), 0))


def test_a_number_is_found_in_whichever_script_either_side_writes_its_digits():
    """Arabic-Indic, Devanagari and Thai digits are the number the ASCII digits write: a phone
    number or an age is found whichever way the record or the question writes it."""
    index = FTSIndex()
    index.add(["عمري ٢٧ سنة", "मेरा नंबर ९८७६५४३२१० है", "เบอร์ ๐๘๑๒๓๔๕๖๗๘ ค่ะ", "I am 31 years old"])
    for query, found in (("27", 0), ("٢٧", 0), ("9876543210", 1), ("०८१२३४५६७८", 2), ("๓๑", 3), ("31", 3)):
        positions, _ = index.search(query, k=4)
        assert positions.tolist() == [found], query


def test_records_added_later_get_the_positions_after_the_earlier_ones():
    """``position`` maps a record id to its row; the memory bank links evidence nodes to
    records through it when a write extends a held search state. Numbering a second batch from
    0 again points the new records' nodes at the first batch's records."""
    lexical = RecordLexical([_amu(0, "Ann paints lakes."), _amu(1, "Ben rides bikes.")])
    lexical.add_records([_amu(2, "Cal bakes bread.")])
    assert lexical.position == {"u:0": 0, "u:1": 1, "u:2": 2}
    positions, _ = lexical.search("bread", 5)
    assert [lexical.position["u:2"]] == list(positions)


def test_excluded_positions_do_not_shorten_the_result_below_k():
    """The search asks FTS5 for k + |exclude| rows so that k remain after the exclusions;
    asking for k returns fewer hits than exist."""
    index = FTSIndex()
    index.add(["pottery class", "pottery wheel", "pottery kiln", "gardening"])
    positions, _ = index.search("pottery", 2, exclude=[0])
    assert len(positions) == 2 and 0 not in positions


def test_equal_scores_rank_in_insertion_order():
    """Ties are broken by rowid ascending (documented: "ties by
    insertion order"); reversing the tie-break flips equal-scored hits."""
    index = FTSIndex()
    index.add(["Ann likes pottery", "Ann likes pottery", "Ann likes pottery"])
    positions, scores = index.search("pottery", 3)
    assert len(set(scores.tolist())) == 1
    assert list(positions) == [0, 1, 2]


def test_save_and_load_keep_k1_and_b(tmp_path):
    """Code_bm25.npz records k1 and b; an index saved without them reloads with the defaults
    (1.2, 0.75) and scores differently from the one saved."""
    index = CodeBM25(8, k1=2.0, b=0.3)
    index.add([[0, 1, 1, 2], [1, 3], [2, 2, 2, 4, 5, 6]])
    index.save(tmp_path)
    loaded = CodeBM25.load(tmp_path)
    assert (loaded.k1, loaded.b) == (2.0, 0.3)
    np.testing.assert_allclose(loaded.scores([1, 2]), index.scores([1, 2]))


def test_a_query_code_equal_to_the_codebook_size_is_a_value_error():
    """Codes lie in [0, num_codes); the upper bound of the query check is exclusive. With
    ``>`` the code num_codes slips past the check and fails as an IndexError deep in numpy."""
    import pytest

    index = CodeBM25(4)
    index.add([[0, 1], [2, 3]])
    with pytest.raises(ValueError, match=r"query codes must lie in \[0, 4\)"):
        index.scores([4])


def test_a_dropped_lexical_table_closes_its_database_at_once():
    """A search state dropped to stay within its bound lets its user's lexical table go: the
    in-memory database closes with it, not when the cyclic collector next runs (a connection and
    its statement cache form a cycle)."""
    import gc
    import sqlite3

    import pytest

    gc.disable()
    try:
        for kind in (FTSIndex, RecordLexical):
            index = kind()
            index.add(["Ann likes Tokyo."])
            db = index._db
            assert db.execute("SELECT count(*) FROM lexical").fetchone() == (1,)
            del index
            with pytest.raises(sqlite3.ProgrammingError, match="closed"):
                db.execute("SELECT 1")
    finally:
        gc.enable()


def test_an_index_s_size_counts_its_connection_not_only_its_pages():
    """A small user's search state is mostly its lexical index's in-memory database, which holds
    about three times its pages in all: its estimate, which the search states' bound sums, counts
    that too (counted as pages alone, 2,000 small users held three times the memory the gauge said)."""
    index = FTSIndex()
    index.add(["Ann walked to the lake.", "Bob bought a kayak."])
    (pages,) = index._db.execute("PRAGMA page_count").fetchone()
    (page_size,) = index._db.execute("PRAGMA page_size").fetchone()
    assert index.size_bytes() == pages * page_size + CONNECTION_BYTES >= 3 * pages * page_size
