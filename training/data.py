"""DailyDialog as (context -> next utterance) pairs for the predictive-coding objective.

Reads the original release layout (``train/dialogues_train.txt`` ..., one dialogue per line,
utterances separated by ``__eou__``) from a local directory: the Hugging Face ``daily_dialog``
loading script does not run on ``datasets>=4``, so a hub parquet copy is optional only.
docs/design.md §1.9.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from datasets import Dataset
from torch.utils.data import DataLoader, Sampler
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from isq.dailydialog import (
    ROOT_ENV,
    SPLITS,
    DataFormatError,
    checked_dialogue,
    detokenize,
    dialogue_pairs,
    load_splits,
    without_leaks,
    without_seen_pairs,
)
from isq.encoder import from_pretrained
from isq.ranges import AT_LEAST_ONE, NON_NEGATIVE, TOKEN_LENGTH, OutOfRange, check_ranges
from isq.synthetic import SYNTHETIC, write_synthetic_corpus

log = logging.getLogger(__name__)

STAGE_SPLITS = {"fit": ("train", "validation"), "validate": ("validation",), "test": ("test",)}
"""The splits each Lightning stage reads; any other stage (or none) tokenises all three."""
RANGES = {"context_turns": AT_LEAST_ONE, "max_context_tokens": TOKEN_LENGTH,
          "max_target_tokens": TOKEN_LENGTH, "batch_size": AT_LEAST_ONE, "num_workers": NON_NEGATIVE,
          "limit_train_dialogues": AT_LEAST_ONE}
"""Allowed range of every numeric argument (``limit_train_dialogues`` None = all)."""


class ResumableShuffle(Sampler[int]):
    """The training pairs in a new random order each epoch, drawn as torch's ``RandomSampler``
    draws it (a seed taken from the global generator when the epoch's first batch is read, so a
    run's order is what the default sampler gave), with the epoch's seed kept: a run resumed
    from a checkpoint taken mid-epoch continues that epoch in the same order, after the pairs
    already trained on (:meth:`ResumableLoader.load_state_dict`), and draws again from the
    next epoch on."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.seed: int | None = None
        """The seed of the epoch being read (None between epochs)."""
        self.resume: tuple[int, int] | None = None
        """(seed, pairs already read) of the epoch to continue, from a checkpoint."""

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Any:
        seed, skip = self.resume or (int(torch.empty((), dtype=torch.int64).random_().item()), 0)
        self.seed, self.resume = seed, None
        generator = torch.Generator()
        generator.manual_seed(seed)
        yield from torch.randperm(self.size, generator=generator).tolist()[skip:]


class ResumableLoader(DataLoader):
    """The training loader of one process, shuffled by :class:`ResumableShuffle` (its ``sampler``).
    Lightning saves its :meth:`state_dict` with every checkpoint and hands it back to
    :meth:`load_state_dict` when a run resumes, so the resumed epoch goes on where the checkpoint
    left it. A loader Lightning rebuilt with a sampler of its own (``overfit_batches``) keeps
    no state."""

    data: L.LightningDataModule | None = None
    """The data module whose trainer's progress says how many batches were trained on."""

    def state_dict(self) -> dict[str, Any]:
        """The epoch's shuffle seed and the training pairs trained on in it (the batches the run
        has processed this epoch, not those read ahead); empty before the first batch and once
        the epoch's batches are done (the next epoch draws afresh)."""
        shuffle, trainer = self.sampler, self.data.trainer if self.data is not None else None
        if not isinstance(shuffle, ResumableShuffle) or shuffle.seed is None or trainer is None:
            return {}
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        batches = progress.processed  # type: ignore[attr-defined]  # a processed tracker, typed as its base
        if batches >= trainer.num_training_batches:  # over: limit_train_batches may end it early
            return {}
        return {"shuffle_seed": shuffle.seed, "pairs_read": batches * self.batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the checkpoint's epoch where it stopped (one taken at an epoch's end starts
        the next epoch afresh)."""
        shuffle = self.sampler
        if state_dict and isinstance(shuffle, ResumableShuffle) and state_dict["pairs_read"] < shuffle.size:
            shuffle.resume = (int(state_dict["shuffle_seed"]), int(state_dict["pairs_read"]))


CONTEXT_CUT = "left"
"""Which end of a context longer than ``max_context_tokens`` is cut: the oldest (a context runs
oldest turn first, and the target replies to its last)."""


def tokenizer_state(tok: PreTrainedTokenizerBase) -> str:
    """What a tokenizer turns text into ids with: a fast tokenizer's serialised pipeline
    (normaliser, pre-tokeniser, vocabulary, merges, post-processor; not its truncation and padding,
    which each call sets), else its class, vocabulary and case folding; the name it was loaded by
    is not enough."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        pipeline = json.loads(backend.to_str())
        fixed = {key: value for key, value in pipeline.items() if key not in ("truncation", "padding")}
        return json.dumps(fixed, sort_keys=True)
    return repr((type(tok).__name__, getattr(tok, "do_lower_case", None), sorted(tok.get_vocab().items())))


def _hub_dialogue(split: str, index: int, utterances: list[str]) -> list[str]:
    """One dialogue of a hub copy, detokenised and checked as the release files' are."""
    try:
        return checked_dialogue([detokenize(t) for t in utterances])
    except DataFormatError as err:
        raise DataFormatError(f"hub split {split!r}, dialogue {index}: {err}") from None


def recorded_root(root: str | None, hub_id: str | None) -> str | None:
    """The data directory a run's checkpoint records, which a resume compares: none where the hub's
    copy is read instead, the synthetic corpus by its name, a directory resolved (a relative path
    read from another working directory is other data)."""
    if hub_id or root is None:
        return None
    return root if root == SYNTHETIC else str(Path(root).resolve())


class DialogueDataModule(L.LightningDataModule):
    """DailyDialog (or the project's synthetic corpus) tokenised for :class:`isq.model.ISQModel`.

    Args:
        root: release directory; default ``$ISQ_DAILYDIALOG``. ``"synthetic"`` writes and reads
            the project's own template corpus.
        tokenizer: tokenizer name or path (linked from the model config by the CLI).
        context_turns: previous utterances in a context.
        max_context_tokens / max_target_tokens: truncation lengths.
        hub_id: optional Hugging Face parquet copy with a ``dialog`` column (list of utterances)
            per split, used instead of ``root``.
        cache_dir: where tokenised datasets are cached (keyed by data, tokenizer and lengths).
        seed: the synthetic corpus's seed, refused with any other data: a run's shuffle and
            initialisation follow ``--seed_everything``, and DailyDialog is the same for every seed.
    """

    def __init__(
        self,
        root: str | None = None,
        tokenizer: str = "t5-base",
        context_turns: int = 3,
        max_context_tokens: int = 128,
        max_target_tokens: int = 48,
        batch_size: int = 32,
        num_workers: int = 0,
        hub_id: str | None = None,
        cache_dir: str | None = None,
        limit_train_dialogues: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        check_ranges("data", locals(), RANGES)
        self.save_hyperparameters()
        self.root = root if root is not None else os.environ.get(ROOT_ENV)
        if seed != 0 and (hub_id or self.root != SYNTHETIC):
            raise OutOfRange(f"data field 'seed' is {seed}: it seeds only the synthetic corpus "
                             f"(--data.root {SYNTHETIC}); a run's seed is --seed_everything")
        self.hparams["root"] = recorded_root(self.root, hub_id)
        self.cache_dir = Path(cache_dir
                              or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "isq")
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self.pairs: dict[str, dict[str, list[str]]] = {}
        self.datasets: dict[str, Dataset] = {}
        self.stats: dict[str, Any] = {}

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            self._tokenizer = from_pretrained(AutoTokenizer, self.hparams["tokenizer"])
        return self._tokenizer

    def _read(self) -> tuple[dict[str, list[list[str]]], str]:
        if self.hparams["hub_id"]:
            from datasets import load_dataset

            hub = load_dataset(self.hparams["hub_id"])
            dialogues, leaked = without_leaks({split: [_hub_dialogue(split, i, d)
                                                       for i, d in enumerate(hub[split]["dialog"])]
                                               for split in SPLITS})
            self._report_leaks(leaked)
            return dialogues, self.hparams["hub_id"]
        if self.root is None:
            raise FileNotFoundError(f"no DailyDialog directory: pass --data.root or set ${ROOT_ENV}")
        root = Path(self.root)
        if self.root == SYNTHETIC:
            root = write_synthetic_corpus(self.cache_dir / "synthetic_corpus", seed=self.hparams["seed"])
        splits = load_splits(root)
        self._report_leaks(splits.leaked)
        self.stats.update({f"label_mismatch_{k}": v for k, v in splits.label_mismatches.items()})
        if any(splits.label_mismatches.values()):
            log.info("dialogues whose act-label count differs from their utterances (labels unused): %s",
                     splits.label_mismatches)
        return splits.dialogues, str(root)

    def _report_leaks(self, leaked: dict[str, int]) -> None:
        self.stats.update({f"leaked_{k}": v for k, v in leaked.items()})
        log.info("dropped evaluation dialogues also in train: %s", leaked)

    def _pairs(self, dialogues: dict[str, list[list[str]]]) -> None:
        """Every split's pairs; an evaluation split's without the pairs train has (of all its
        dialogues, before ``limit_train_dialogues``), counted as ``leaked_pairs_<split>``."""
        turns, limit = self.hparams["context_turns"], self.hparams["limit_train_dialogues"]
        train = dialogue_pairs(dialogues["train"], turns)
        if limit:
            dialogues["train"] = dialogues["train"][:limit]
        for split, items in dialogues.items():
            pairs = train if split == "train" and not limit else dialogue_pairs(items, turns)
            if split != "train":
                pairs, self.stats[f"leaked_pairs_{split}"] = without_seen_pairs(pairs, train)
            self.pairs[split] = pairs
            self.stats[f"{split}_dialogues"] = len(items)
            self.stats[f"{split}_pairs"] = len(pairs["context"])

    def setup(self, stage: str | None = None) -> None:
        """Read every split (their sizes go into the run record); tokenise only those the
        stage uses (:data:`STAGE_SPLITS`), so a training run does not tokenise the test split."""
        if not self.pairs:
            dialogues, self.stats["source"] = self._read()
            self._pairs(dialogues)
        for split in STAGE_SPLITS.get(stage or "", SPLITS):
            if not self.pairs[split]["context"]:
                raise DataFormatError(
                    f"the {split} split of {self.stats['source']} has no pairs left "
                    f"({self.stats.get(f'leaked_{split}', 0)} dialogues dropped as also in train, "
                    f"{self.stats.get(f'leaked_pairs_{split}', 0)} pairs as train's): nothing would "
                    "choose or score the weights")
            if split not in self.datasets:
                self.datasets[split] = self._tokenize(split, self.pairs[split])

    def _tokenize(self, split: str, pairs: dict[str, list[str]]) -> Dataset:
        """The split's pairs as token ids, cached under a key of the pairs, the tokenizer as it is
        (:func:`tokenizer_state`: another tokenizer saved at the same path is another key) and
        the cuts."""
        h = self.hparams
        tok = self.tokenizer
        key = hashlib.sha256(repr((pairs["context"], pairs["target"], tokenizer_state(tok),
                                   h["max_context_tokens"], h["max_target_tokens"],
                                   CONTEXT_CUT)).encode()).hexdigest()[:16]
        cache = self.cache_dir / "tokenized" / f"{split}-{key}.arrow"
        cache.parent.mkdir(parents=True, exist_ok=True)

        def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
            tok.truncation_side = CONTEXT_CUT  # a long context loses its oldest tokens
            ctx = tok(batch["context"], truncation=True, max_length=h["max_context_tokens"])
            tok.truncation_side = "right"  # a long target keeps its start
            tgt = tok(batch["target"], truncation=True, max_length=h["max_target_tokens"])
            return {"input_ids": ctx["input_ids"], "labels": tgt["input_ids"]}

        def tokenised() -> Dataset:
            return Dataset.from_dict(pairs).map(
                encode, batched=True, remove_columns=["context", "target"], cache_file_name=str(cache),
                desc=f"tokenising {split}",
            )

        cached = cache.is_file()
        try:
            dataset = tokenised()
            if cached and len(dataset) != len(pairs["context"]):  # cut where a batch of rows ends: it reads
                raise ValueError(f"{len(dataset)} rows for {len(pairs['context'])} pairs")
        except (OSError, ValueError) as err:  # pyarrow's errors for a damaged file are both
            if not cached:
                raise
            # a cache that cannot be read (truncated by a full disk or a copy) would fail every rerun:
            # its key does not change; it is derived, so it is made again
            log.warning("tokenising %s again: its cache %s cannot be read (%s)", split, cache, err)
            cache.unlink()
            dataset = tokenised()
        return dataset.with_format("python")

    def _collate(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        pad = self.tokenizer.pad_token_id or 0
        ctx_len = max(len(r["input_ids"]) for r in rows)
        tgt_len = max(len(r["labels"]) for r in rows)
        input_ids = torch.full((len(rows), ctx_len), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), ctx_len), dtype=torch.long)
        labels = torch.full((len(rows), tgt_len), -100, dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            attention_mask[i, : len(r["input_ids"])] = 1
            labels[i, : len(r["labels"])] = torch.tensor(r["labels"])
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    def _options(self) -> dict[str, Any]:
        """What every loader of the module is made with (batch size, workers, collation)."""
        workers = self.hparams["num_workers"]
        return {"batch_size": self.hparams["batch_size"], "num_workers": workers, "collate_fn": self._collate,
                "persistent_workers": workers > 0}

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        return DataLoader(self.datasets[split], shuffle=shuffle, **self._options())

    def train_dataloader(self) -> DataLoader:
        """Shuffled each epoch and resumable mid-epoch on one process (:class:`ResumableLoader`).
        Under several processes Lightning puts its distributed sampler in place of the default
        one (a seeded order per epoch, split across the ranks), and a mid-epoch resume restarts
        the epoch (Lightning warns)."""
        if self.trainer is not None and self.trainer.world_size > 1:
            return self._loader("train", shuffle=True)
        train = self.datasets["train"]
        loader = ResumableLoader(train, sampler=ResumableShuffle(len(train)), **self._options())
        loader.data = self
        return loader

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
