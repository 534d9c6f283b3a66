"""Lexical controls of the evaluation: the lexical-gap subset and paired comparisons pooled
over runs (training seeds)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from retrieval.eval.lexical_gap import content_stems, gap_flags, gap_recall
from retrieval.eval.locomo import LocomoConversation, LocomoSession
from retrieval.eval.metrics import score_evidence
from retrieval.eval.paired_differences import compare
from retrieval.eval.questions import EvalQuestion
from retrieval.eval.results import QuestionRecord, read_questions, write_questions
from retrieval.memory.records import Turn

WHEN = datetime(2023, 5, 8)
TURNS = (Turn("c", "s1", "D1:1", "Anna", "I painted a lake at sunrise.", WHEN),
         Turn("c", "s1", "D1:2", "Ben", "We went to the museum downtown.", WHEN),
         Turn("c", "s1", "D1:3", "Anna", "Look at this!", WHEN, image_caption="a photo of a red bicycle"))
CONVERSATION = LocomoConversation("c", "Anna", "Ben", (LocomoSession("s1", 1, WHEN, TURNS),), ())


def ask(text: str, *evidence: str) -> EvalQuestion:
    return EvalQuestion("c", 0, 1, text, None, evidence)


def test_content_stems_drop_stopwords_and_names_and_stem_the_rest() -> None:
    assert content_stems("Where did Anna paint the lakes?", frozenset({"anna"})) == {"paint", "lake"}


def test_a_question_is_in_the_gap_when_its_evidence_shares_no_content_stem() -> None:
    questions = [ask("What did Anna paint?", "D1:1"),  # "painted": shares the stem
                 ask("Which gallery did Ben visit?", "D1:2"),  # museum / went: no shared stem
                 ask("What bicycle does Anna own?", "D1:3"),  # the image caption counts
                 ask("Which gallery did Ben visit?", "D1:1", "D1:2")]
    assert gap_flags(questions, [CONVERSATION]) == [False, True, False, True]


def test_gap_recall_averages_the_flagged_questions_only() -> None:
    scores = {"a": [score_evidence(["D1:1"], {"D1:1"}), score_evidence(["D1:2"], set()),
                    score_evidence(["D1:2", "D1:3"], {"D1:3"})]}
    assert gap_recall([False, True, True], scores) == {"a": pytest.approx(0.25)}
    assert gap_recall([False, False, False], scores) == {}


def run_file(path: Path, found_base: list[list[str]], found_other: list[list[str]]) -> Path:
    rows = [QuestionRecord(conversation="c", qa_index=i, category="multi-hop", question=f"q{i}",
                           evidence=["D1:1"], found={"base": base, "other": other}, lexical_gap=(i % 2 == 0))
            for i, (base, other) in enumerate(zip(found_base, found_other, strict=True))]
    write_questions(path, rows)
    return path


def test_compare_pools_runs_question_by_question_and_adds_the_gap_group(tmp_path: Path) -> None:
    one = run_file(tmp_path / "a.jsonl", [[], [], ["D1:1"], []], [["D1:1"], [], ["D1:1"], []])
    two = run_file(tmp_path / "b.jsonl", [[], [], [], []], [[], [], ["D1:1"], ["D1:1"]])
    pooled = compare([one, two], "base", ["other"])["other"]
    # per question (other - base), averaged over the two runs: +0.5, 0, +0.5, +0.5 -> +37.5 points
    assert pooled["overall"].mean == pytest.approx(37.5)
    assert pooled["lexical gap"].n == 2 and pooled["lexical gap"].mean == pytest.approx(50.0)
    assert compare(one, "base", ["other"])["other"]["overall"].mean == pytest.approx(25.0)
    other_questions = run_file(tmp_path / "c.jsonl", [[]] * 3, [[]] * 3)
    with pytest.raises(ValueError, match="not the same questions"):
        compare([one, other_questions], "base", ["other"])
    rows = read_questions(two)
    for change in ({"question": "another question"}, {"evidence": ["D1:2"]}, {"category": "temporal"}):
        write_questions(tmp_path / "d.jsonl", [rows[0].model_copy(update=change), *rows[1:]])
        with pytest.raises(ValueError, match="conversation c qa 0 differs"):
            compare([one, tmp_path / "d.jsonl"], "base", ["other"])


def test_runs_under_one_tag_are_pooled_against_pooled_main_runs(tmp_path: Path) -> None:
    from retrieval.paired import main

    one = run_file(tmp_path / "a.jsonl", [[], [], ["D1:1"], []], [["D1:1"], [], ["D1:1"], []])
    two = run_file(tmp_path / "b.jsonl", [[], [], [], []], [[], [], ["D1:1"], ["D1:1"]])
    # The same seeds with another Path B setting: "other" finds question 0's evidence in one run.
    flat_one = run_file(tmp_path / "a0.jsonl", [[]] * 4, [[]] * 4)
    flat_two = run_file(tmp_path / "b0.jsonl", [[]] * 4, [["D1:1"], [], [], []])
    table = compare([one, two], "other@h0", ["other"], tagged={"h0": [flat_one, flat_two]})["other"]
    # pooled "other" 0.5, 0, 1, 0.5 against pooled "other@h0" 0.5, 0, 0, 0 -> +37.5 points
    assert table["overall"].mean == pytest.approx(37.5)
    assert main([str(one), "--pool", str(two), "--with", f"{flat_one}:h0", "--with", f"{flat_two}:h0",
                 "--baseline", "other@h0", "other"]) == 0
    other_questions = run_file(tmp_path / "c.jsonl", [[]] * 3, [[]] * 3)
    with pytest.raises(ValueError, match="not the same questions"):
        compare(one, "base", ["other"], tagged={"h0": [flat_one, other_questions]})


def runs_of(path: Path, conversation: str, evidence: list[str], found: list[tuple[list[str], list[str]]]
            ) -> Path:
    rows = [QuestionRecord(conversation=conversation if i < 2 else "d", qa_index=i, category="single-hop",
                           question=f"q{i}", evidence=evidence, found={"base": base, "other": other})
            for i, (base, other) in enumerate(found)]
    write_questions(path, rows)
    return path


def test_resampling_runs_puts_their_spread_into_the_interval(tmp_path: Path) -> None:
    """Seed 1 finds "other" better on every question, seed 2 no different: pooled, every question
    differs by +50 points and the questions alone give no spread; with the runs drawn too the
    interval runs from seed 2's 0 to seed 1's +100."""
    better = runs_of(tmp_path / "s1.jsonl", "c", ["D1:1"], [([], ["D1:1"])] * 4)
    level = runs_of(tmp_path / "s2.jsonl", "c", ["D1:1"], [([], [])] * 4)
    questions_only = compare([better, level], "base", ["other"])["other"]["overall"]
    assert (questions_only.mean, questions_only.low, questions_only.high) == (50.0, 50.0, 50.0)
    both = compare([better, level], "base", ["other"], resample_runs=True)["other"]["overall"]
    assert (both.mean, both.low, both.high, both.better, both.worse) == (50.0, 0.0, 100.0, 4, 0)


def test_resampled_runs_stay_paired_within_a_seed(tmp_path: Path) -> None:
    """Each seed finds "other" half an evidence list ahead of "base" on every question, at
    different levels: drawn in pairs the difference never varies; a tagged run set is no seed's
    pair, drawn apart, and varies."""
    evidence = ["D1:1", "D1:2"]
    one = runs_of(tmp_path / "s1.jsonl", "c", evidence, [([], ["D1:1"])] * 4)
    two = runs_of(tmp_path / "s2.jsonl", "c", evidence, [(["D1:1"], evidence)] * 4)
    paired = compare([one, two], "base", ["other"], resample_runs=True)["other"]["overall"]
    assert (paired.mean, paired.low, paired.high) == pytest.approx((50.0, 50.0, 50.0))
    apart = compare([one, two], "base@t", ["other"], tagged={"t": [one, two]}, resample_runs=True)
    assert apart["other"]["overall"].low < 50.0 < apart["other"]["overall"].high


def test_each_conversation_is_a_group_when_asked(tmp_path: Path) -> None:
    from retrieval.paired import main

    path = runs_of(tmp_path / "a.jsonl", "c", ["D1:1"], [([], ["D1:1"]), ([], []), ([], []), (["D1:1"], [])])
    table = compare(path, "base", ["other"], by_conversation=True)["other"]
    assert list(table) == ["overall", "single-hop", "c", "d"]
    assert (table["c"].n, table["c"].mean, table["d"].n, table["d"].mean) == (2, 50.0, 2, -50.0)
    assert "d" not in compare(path, "base", ["other"])["other"]
    assert main([str(path), "--by-conversation", "--resample-runs", "--baseline", "base", "other"]) == 0


def test_the_lexical_channel_drops_stopwords_from_queries() -> None:
    from retrieval.index.fts import FTSIndex, match_expression

    assert match_expression("What did Anna paint in the park, anna?") == '"Anna" OR "paint" OR "park"'
    assert match_expression("What is it?") == '"What" OR "is" OR "it"'  # nothing else to match
    index = FTSIndex()
    index.add(["Anna painted a lake.", "What is the time?"])
    positions, _ = index.search("what did Anna paint", 5)
    assert list(positions) == [0]  # "what" alone no longer matches the second text; "paint" is stemmed


@pytest.mark.parametrize("word", ["İstanbul", "ᏣᎳᎩ", "ᲡᲐᲥᲐᲠᲗᲕᲔᲚᲝ"])
def test_a_word_written_as_in_a_record_finds_it(word: str) -> None:
    """FTS5 folds case by an older Unicode than Python's lower(): a query lower-cased by Python
    ("İ" to "i" and a combining dot; Cherokee and Georgian capitals to letters FTS5 keeps apart)
    did not find the word it was written as."""
    from retrieval.index.fts import FTSIndex

    index = FTSIndex()
    index.add(["Ann moved there last year.", f"Ann moved to {word} last year."])
    positions, _ = index.search(word, 5)
    assert list(positions) == [1]


@pytest.mark.parametrize(("record", "query"), [("NFC", "NFD"), ("NFD", "NFC")])
def test_a_word_finds_its_record_in_either_unicode_form(record: str, query: str) -> None:
    """A letter of two accents ("ở") is one character composed and three decomposed, and the
    tokenizer folds only the second to "o": both sides are taken composed, so "phở" finds "phở"
    whichever way each was written."""
    import unicodedata

    from retrieval.index.fts import FTSIndex

    index = FTSIndex()
    index.add(["Ann likes soup.", unicodedata.normalize(record, "Tôi ăn phở với người bạn mới.")])
    for word in ("phở", "người", "mới"):
        positions, _ = index.search(unicodedata.normalize(query, word), 5)
        assert list(positions) == [1], word


@pytest.mark.parametrize(("query", "found"), [
    ("東京", [0]), ("猫", [0]), ("猫を飼っていますか", [0]), ("饺子", [1]), ("我喜欢饺子", [1]),
    ("Tokyo", [2]), ("京", [1, 0]), ("佐々木", [4]), ("ジョン・スミス", []), ("ｶﾀ", [5])])
def test_a_cjk_word_inside_a_sentence_is_found(query: str, found: list[int]) -> None:
    """FTS5 takes a run of kana or ideographs for one word: both sides are written as character
    pairs (a lone query character as a prefix), so a word finds the sentence that holds it; an
    iteration mark belongs to its run, a katakana middle dot does not."""
    from retrieval.index.fts import FTSIndex

    index = FTSIndex()
    index.add(["東京で猫を飼っています", "我在北京喜欢吃饺子", "Ann likes Tokyo.", "パンとスイーツ",
               "佐々木さんに会った", "ｶﾀｶﾅです"])
    positions, _ = index.search(query, 5)
    assert list(positions) == found


@pytest.mark.parametrize(("query", "found"), [
    ("แมว", [0]), ("ชื่อ", [0]), ("แมวของฉัน", [0]), ("ไทย", [1]), ("ឆ្មា", [2]), ("ແມວ", [3]),
    ("ကြောင်", [4]), ("Tokyo", [5])])
def test_a_thai_word_inside_a_sentence_is_found(query: str, found: list[int]) -> None:
    """Thai, Lao, Myanmar and Khmer are written without spaces too, and FTS5 ends a word at each of
    their vowel signs and tone marks: their letters are paired without the marks, so "cat" (แมว)
    finds "I have a cat named Pickle" (before, in no sentence but alone), and "name" (ชื่อ) is one
    word, not three."""
    from retrieval.index.fts import FTSIndex

    index = FTSIndex()
    index.add(["ฉันมีแมวชื่อพิกเคิล", "เราไปกินข้าวที่ร้านอาหารไทย", "ខ្ញុំចូលចិត្តឆ្មា។ វាឈ្មោះពិកឃើល", "ຂ້ອຍມີແມວ",
               "ကျွန်တော် ကြောင် ချစ်တယ်", "Ann likes Tokyo."])
    positions, _ = index.search(query, 5)
    assert list(positions) == found


def test_a_stray_tone_mark_is_no_word() -> None:
    """A run of Thai marks alone (a tone mark after a space or a Latin letter) holds no letter
    to pair: it is indexed as nothing, and as a query it matches nothing."""
    from retrieval.index.fts import FTSIndex, match_expression

    index = FTSIndex()
    index.add(["555 \u0e48", "ok\u0e49\u0e48 แมว"])
    assert match_expression("\u0e48") is None
    assert list(index.search("แมว \u0e48", 5)[0]) == [1]


def test_records_of_another_script_leave_the_order_of_a_latin_query_as_it_was() -> None:
    """Paired runs count about one token a character in a row's length, which BM25 normalises by:
    twenty Japanese records beside a user's English ones leave the order of its English matches
    (characters and pairs together flipped it at ten; a run's tokens are still about twice its
    words, so many more can)."""
    from retrieval.index.fts import FTSIndex

    texts = ["Ann loves pottery and she took a pottery class at the community center downtown last spring",
             "pottery with Mel", *(f"a note about gardening number {i}" for i in range(10))]
    japanese = ["昨日は雨が降っていたので家でずっと本を読んでいました。とても面白い小説でした。"] * 20
    orders = []
    for rows in (texts, texts + japanese):
        index = FTSIndex()
        index.add(rows)
        orders.append(list(index.search("pottery", 2)[0]))
    assert orders == [[1, 0], [1, 0]]
