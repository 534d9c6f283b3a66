"""DailyDialog reading: detokenisation, pairs, leakage, malformed files (docs/design.md §1.9)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from isq.dailydialog import DataFormatError, detokenize, dialogue_pairs, load_splits, read_dialogues
from isq.ranges import OutOfRange
from isq.synthetic import write_synthetic_corpus
from training.data import DialogueDataModule


def write_release(root: Path, train: list[str], validation: list[str], test: list[str]) -> Path:
    for split, lines in (("train", train), ("validation", validation), ("test", test)):
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / split / f"dialogues_{split}.txt").write_text("".join(line + "\n" for line in lines))
    return root


@pytest.mark.parametrize(("raw", "clean"), [
    ("Say , Jim , how about going for a few beers after dinner ?",
     "Say, Jim, how about going for a few beers after dinner?"),
    ("It ' s 5 % off ( today only ) .", "It's 5% off (today only)."),
    ("I don ' t know . You ' re right !", "I don't know. You're right!"),
    ("It costs $ 20 .", "It costs $20."),
])
def test_detokenize(raw, clean):
    assert detokenize(raw) == clean


def test_pairs_carry_speaker_tags_and_bounded_context():
    pairs = dialogue_pairs([["Hi .", "Hello .", "How are you ?", "Fine ."]], context_turns=2)
    assert pairs["target"] == ["Hello .", "How are you ?", "Fine ."]
    assert pairs["context"] == ["A: Hi .", "A: Hi . B: Hello .", "B: Hello . A: How are you ?"]


def test_leaked_evaluation_dialogues_are_dropped_and_counted(tmp_path):
    shared = "Hi , Tom . __eou__ Hello , Ann . __eou__"
    root = write_release(tmp_path, [shared, "A . __eou__ B . __eou__"],
                         [shared, "C . __eou__ D . __eou__"], ["E . __eou__ F . __eou__"])
    splits = load_splits(root)
    assert splits.leaked == {"validation": 1, "test": 0}
    assert splits.dialogues["validation"] == [["C.", "D."]]


def test_a_validation_split_left_empty_by_the_leak_filter_is_refused(tmp_path):
    """Training with nothing to validate would export weights no validation chose."""
    shared = "Hi , Tom . __eou__ Hello , Ann . __eou__"
    root = write_release(tmp_path / "data", [shared, "A . __eou__ B . __eou__"], [shared],
                         ["E . __eou__ F . __eou__"])
    dm = DialogueDataModule(root=str(root), tokenizer="offline:all-MiniLM-L6-v2",
                            cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataFormatError, match=r"validation split .* no pairs left \(1 dialogues dropped"):
        dm.setup("fit")
    dm.setup("test")  # the test split has pairs of its own


def test_the_data_seed_is_the_synthetic_corpus_s_alone(tmp_path):
    """DailyDialog is the same for every data seed: a seed study through it would train one model
    and report no spread; the run's seed is --seed_everything."""
    root = write_release(tmp_path / "data", ["A . __eou__ B . __eou__"], ["C . __eou__ D . __eou__"],
                         ["E . __eou__ F . __eou__"])
    for given in ({"root": str(root)}, {"hub_id": "someone/dailydialog"}):
        with pytest.raises(OutOfRange, match="data field 'seed' is 3: it seeds only the synthetic corpus"):
            DialogueDataModule(**given, seed=3)
    assert DialogueDataModule(root=str(root)).hparams["seed"] == 0
    assert DialogueDataModule(root="synthetic", seed=3).hparams["seed"] == 3


def test_a_copy_differing_in_case_spacing_or_apostrophes_is_a_leak(tmp_path):
    train = "Not at all . I ’ m an agnostic . Do you ? __eou__ No , sir.How about you ? __eou__"
    copy = "Not at all . I ' m an agnostic . do you ? __eou__ No , sir . How about you ? __eou__"
    root = write_release(tmp_path, [train], [copy, "C . __eou__ D . __eou__"], ["E . __eou__ F . __eou__"])
    splits = load_splits(root)
    assert splits.leaked == {"validation": 1, "test": 0} and splits.dialogues["validation"] == [["C.", "D."]]


def test_evaluation_pairs_that_train_holds_are_dropped_and_counted(tmp_path):
    """A validation dialogue that opens as a train dialogue does (and goes on otherwise) holds a
    pair training saw: it is dropped from validation, the rest of the dialogue kept."""
    root = write_release(tmp_path, ["Good morning . __eou__ Morning , sir . __eou__ Tea ? __eou__"] * 2,
                         ["Good morning . __eou__ Morning , Sir . __eou__ Coffee , please . __eou__"],
                         ["E . __eou__ F . __eou__"])
    dm = DialogueDataModule(root=str(root), tokenizer="offline:all-MiniLM-L6-v2", context_turns=2,
                            limit_train_dialogues=1, cache_dir=str(tmp_path / "cache"))
    dm.setup("validate")
    assert dm.pairs["validation"] == {"context": ["A: Good morning. B: Morning, Sir."],
                                      "target": ["Coffee, please."]}
    assert (dm.stats["leaked_pairs_validation"], dm.stats["validation_pairs"]) == (1, 1)
    assert dm.stats["leaked_pairs_test"] == 0 and dm.stats["train_dialogues"] == 1


def test_a_long_context_loses_its_oldest_tokens_and_keeps_the_turn_replied_to(tmp_path):
    old = " ".join(["long ago"] * 30)
    root = write_release(tmp_path, [f"{old} . __eou__ What now ? __eou__ Sleep . __eou__"],
                         ["A . __eou__ B . __eou__"], ["E . __eou__ F . __eou__"])
    dm = DialogueDataModule(root=str(root), tokenizer="offline:all-MiniLM-L6-v2", max_context_tokens=12,
                            max_target_tokens=3, cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    rows = list(dm.datasets["train"])
    decoded = [dm.tokenizer.decode(row["input_ids"]) for row in rows]
    assert decoded[1].endswith("b : what now? [SEP]") and decoded[1].startswith("[CLS] long ago")
    assert [len(row["input_ids"]) for row in rows] == [12, 12]
    assert dm.tokenizer.decode(rows[0]["labels"]) == "[CLS] what [SEP]"  # a long target keeps its start


def test_an_act_label_file_that_is_not_utf8_is_named(tmp_path):
    root = write_release(tmp_path, ["A . __eou__ B . __eou__"], ["E . __eou__ F . __eou__"],
                         ["G . __eou__ H . __eou__"])
    (root / "train" / "dialogues_act_train.txt").write_bytes(b"\xff 1 2\n")
    with pytest.raises(DataFormatError, match=r"dialogues_act_train\.txt: not UTF-8"):
        load_splits(root)


def test_act_label_count_mismatch_is_tolerated_and_counted(tmp_path):
    root = write_release(tmp_path, ["A . __eou__ B . __eou__", "C . __eou__ D . __eou__"],
                         ["E . __eou__ F . __eou__"], ["G . __eou__ H . __eou__"])
    (root / "train" / "dialogues_act_train.txt").write_text("1 2\n1 2 3\n")
    assert load_splits(root).label_mismatches["train"] == 1


@pytest.mark.parametrize(("second_line", "message"), [
    ("no separator here", "no '__eou__'"),
    ("Only one . __eou__", "a dialogue needs at least two"),
    # dropped, an empty utterance would give every later one the other speaker's tag
    ("Hi , Ann . __eou__   __eou__ Hello Bob . __eou__", "utterance 2 of 3 is empty"),
])
def test_a_malformed_dialogue_names_file_and_line(tmp_path, second_line, message):
    path = tmp_path / "dialogues_train.txt"
    path.write_text(f"Hi . __eou__ Hello . __eou__\n{second_line}\n")
    with pytest.raises(DataFormatError, match=rf"dialogues_train\.txt:2: {message}"):
        read_dialogues(path)


def test_binary_file_is_refused(tmp_path):
    path = tmp_path / "d.txt"
    path.write_bytes(b"\xff\xfe\x00garbage __eou__")
    with pytest.raises(DataFormatError, match="not UTF-8"):
        read_dialogues(path)


def test_missing_root_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="--data.root"):
        load_splits(tmp_path / "absent")


def test_datamodule_tokenises_and_batches_with_masks(tmp_path):
    root = write_synthetic_corpus(tmp_path / "corpus", sizes=(20, 5, 5))
    dm = DialogueDataModule(root=str(root), tokenizer="offline:all-MiniLM-L6-v2", batch_size=4,
                            max_context_tokens=24, cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[1] <= 24
    assert (batch["attention_mask"].sum(1) > 0).all()
    assert ((batch["labels"] == -100) | (batch["labels"] >= 0)).all()
    assert dm.stats["train_dialogues"] == 20 and dm.stats["train_pairs"] > 20
    assert list((tmp_path / "cache" / "tokenized").glob("train-*.arrow")), "tokenised data not cached"


def test_a_tokenised_cache_that_cannot_be_read_is_made_again(tmp_path, caplog):
    """A cache file cut short (a full disk, a partial copy) keeps its name, which is its key: read
    as it is, every rerun would fail on it. It is tokenised again, to the same ids."""
    root = write_synthetic_corpus(tmp_path / "corpus", sizes=(20, 5, 5))

    def train_ids() -> list[list[int]]:
        dm = DialogueDataModule(root=str(root), tokenizer="offline:all-MiniLM-L6-v2",
                                cache_dir=str(tmp_path / "cache"))
        dm.setup("fit")
        return [row["input_ids"] for row in dm.datasets["train"]]

    before = train_ids()
    (cache,) = (tmp_path / "cache" / "tokenized").glob("train-*.arrow")
    for size in (1000, 8):  # pyarrow's error for each is another: an OSError, an ArrowInvalid
        os.truncate(cache, size)
        with caplog.at_level(logging.WARNING, logger="training.data"):
            assert train_ids() == before
        assert f"tokenising train again: its cache {cache} cannot be read" in caplog.text
        caplog.clear()


def test_a_tokenised_cache_cut_where_a_batch_of_rows_ends_is_made_again(tmp_path, caplog):
    """Cut exactly after one of its record batches (1,000 rows each), a cache file reads without an
    error, short: trained on as it is, a run would see part of its data and say nothing."""
    import pyarrow

    root = write_synthetic_corpus(tmp_path / "corpus", sizes=(700, 5, 5))

    def train_rows() -> int:
        dm = DialogueDataModule(root=str(root), tokenizer="offline:all-MiniLM-L6-v2",
                                cache_dir=str(tmp_path / "cache"))
        dm.setup("fit")
        return len(dm.datasets["train"])

    rows = train_rows()
    (cache,) = (tmp_path / "cache" / "tokenized").glob("train-*.arrow")
    with pyarrow.memory_map(str(cache)) as source:
        reader = pyarrow.ipc.open_stream(source)
        next(iter(reader))
        first_batch_ends = source.tell()
    os.truncate(cache, first_batch_ends)
    with caplog.at_level(logging.WARNING, logger="training.data"):
        assert rows > 1000 and train_rows() == rows
    assert f"1000 rows for {rows} pairs" in caplog.text


def test_a_tokenizer_changed_at_the_same_path_tokenises_again(tmp_path):
    """The tokenised cache is keyed by what the tokenizer does, not by the path it was loaded from:
    token ids cached for an earlier tokenizer saved there must not reach training."""
    from transformers import AutoTokenizer

    from isq.encoder import resolve_encoder_path

    root = write_synthetic_corpus(tmp_path / "corpus", sizes=(6, 2, 2))
    saved = tmp_path / "tok"
    AutoTokenizer.from_pretrained(resolve_encoder_path("offline:all-MiniLM-L6-v2")).save_pretrained(saved)

    def first_ids() -> list[int]:
        dm = DialogueDataModule(root=str(root), tokenizer=str(saved), cache_dir=str(tmp_path / "cache"))
        dm.setup("fit")
        return dm.datasets["train"][0]["input_ids"]

    before = first_ids()
    assert first_ids() == before  # read from the cache: a tokenizer's call leaves its key as it was
    assert len(list((tmp_path / "cache" / "tokenized").glob("*.arrow"))) == 2  # train and validation
    spec = json.loads((saved / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    swapped = AutoTokenizer.from_pretrained(saved).convert_ids_to_tokens(before[1:3])
    vocab[swapped[0]], vocab[swapped[1]] = vocab[swapped[1]], vocab[swapped[0]]
    (saved / "tokenizer.json").write_text(json.dumps(spec))
    (saved / "vocab.txt").unlink(missing_ok=True)  # a slow tokenizer would read this one
    after = first_ids()
    assert after != before and after[1:3] == before[2:0:-1]
    assert len(list((tmp_path / "cache" / "tokenized").glob("train-*.arrow"))) == 2
    assert len(list((tmp_path / "cache" / "tokenized").glob("validation-*.arrow"))) == 2


def test_rewriting_the_synthetic_corpus_never_exposes_a_partial_file(tmp_path, monkeypatch):
    # Under DDP every rank writes the corpus while another may be reading it (a rank once read
    # an empty train file). Read the corpus at the moment each new file is about to replace the
    # old one: the reader must still see every dialogue.
    import isq.synthetic as synthetic

    root = write_synthetic_corpus(tmp_path / "c", sizes=(6, 3, 3))
    real_replace, seen = synthetic.os.replace, []

    def read_then_replace(src, dst):
        seen.append(len(read_dialogues(Path(dst))))
        real_replace(src, dst)

    monkeypatch.setattr(synthetic.os, "replace", read_then_replace)
    write_synthetic_corpus(root, sizes=(6, 3, 3))
    assert seen == [6, 3, 3]
    assert sorted(p.name for p in (root / "train").iterdir()) == ["dialogues_train.txt"]  # no staging left


def test_synthetic_corpus_is_deterministic(tmp_path):
    a = write_synthetic_corpus(tmp_path / "a", sizes=(5, 2, 2), seed=3)
    b = write_synthetic_corpus(tmp_path / "b", sizes=(5, 2, 2), seed=3)
    assert ((a / "train" / "dialogues_train.txt").read_text()
            == (b / "train" / "dialogues_train.txt").read_text())
    assert len(read_dialogues(a / "train" / "dialogues_train.txt")) == 5


def test_a_hub_copy_drops_the_evaluation_dialogues_train_holds_as_the_release_does(tmp_path, monkeypatch):
    """--data.hub_id reads the splits from a parquet copy: the validation and test dialogues that
    are also in train are dropped and counted, as they are from the release directory."""
    import datasets

    train = [["Hi there .", "Hello , how are you ?"], ["Shall we go ?", "Yes , let us go ."]]
    copy = {"train": {"dialog": train}, "validation": {"dialog": [train[0], ["New one .", "Indeed ."]]},
            "test": {"dialog": [train[1], train[0], ["Fresh .", "Quite ."]]}}
    monkeypatch.setattr(datasets, "load_dataset", {"someone/dailydialog": copy}.__getitem__)
    dm = DialogueDataModule(hub_id="someone/dailydialog", tokenizer="offline:all-MiniLM-L6-v2",
                            cache_dir=str(tmp_path / "cache"))
    dm.setup("validate")
    assert (dm.stats["leaked_validation"], dm.stats["leaked_test"]) == (1, 2)
    assert (dm.stats["validation_dialogues"], dm.stats["test_dialogues"]) == (1, 1)
    assert dm.stats["train_dialogues"] == 2 and dm.stats["source"] == "someone/dailydialog"
    copy["test"]["dialog"].append(["Hello .", "", "Bye ."])
    with pytest.raises(DataFormatError, match="hub split 'test', dialogue 3: utterance 2 of 3 is empty"):
        DialogueDataModule(hub_id="someone/dailydialog", tokenizer="offline:all-MiniLM-L6-v2",
                           cache_dir=str(tmp_path / "cache")).setup("validate")
