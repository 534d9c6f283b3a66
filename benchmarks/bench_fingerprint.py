"""Fingerprinting throughput against the bare encoder forward, in one run.

Both sides take the same texts, in the same batches (sorted by character length, ``--batch-size``
texts each, as :func:`isq.batches.encode_batches` forms them), through the same tokenizer
(truncation at the fingerprinter's ``max_length``), under ``torch.inference_mode``:

- encoder: tokenize + the encoder's forward (to its last hidden states), nothing else;
- fingerprint: :meth:`isq.fingerprint.Fingerprinter.fingerprint`, i.e. tokenize + encoder +
  stride-1 projection + nearest code per token + the per-text code sequences and sets.

Rounds alternate which side goes first; the reported ratio (fingerprint texts/s over encoder
texts/s) is the median of the per-round ratios, with its spread. The SHA-256 of all token codes
is printed so that a change to the encoding path can be checked to leave every code unchanged.

    python -m benchmarks.bench_fingerprint --rounds 5 --json perf/fingerprint.json
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
import torch

from benchmarks.arguments import add_json_option, within
from benchmarks.timing import describe_ratio, interleaved_rounds, ratio_spread, spread, write_json
from isq.batches import length_order
from isq.codes import Fingerprint
from isq.dailydialog import read_dialogues
from isq.fingerprint import Fingerprinter

DEFAULT_CHECKPOINT = "checkpoints/isq_minilm_dailydialog_cpu"
DEFAULT_LOCOMO = "../shared/data/locomo/locomo_dev.json"
DEFAULT_DAILYDIALOG = "../shared/data/dailydialog/validation/dialogues_validation.txt"


def load_texts(source: str, path: str | None, limit: int) -> list[str]:
    """Dialogue turns: LoCoMo turns (``locomo``) or DailyDialog utterances (``dailydialog``)."""
    if source == "locomo":
        from retrieval.eval.locomo import load_locomo

        conversations = load_locomo(path or DEFAULT_LOCOMO)
        texts = [turn.text for conversation in conversations for turn in conversation.turns]
    else:
        texts = [turn for dialogue in read_dialogues(Path(path or DEFAULT_DAILYDIALOG)) for turn in dialogue]
    return texts[:limit] if limit > 0 else texts


@torch.inference_mode()
def encode_only(fingerprinter: Fingerprinter, texts: list[str], batch_size: int) -> int:
    """The bare encoder over ``texts`` in the fingerprinter's batches; returns the real tokens seen."""
    encoder, tokenizer = fingerprinter.semantic_encoder.encoder, fingerprinter.tokenizer
    order = length_order(texts)
    tokens = 0
    for start in range(0, len(order), batch_size):
        batch = tokenizer([texts[i] for i in order[start : start + batch_size]], padding=True,
                          truncation=True, max_length=fingerprinter.config.max_length, return_tensors="pt")
        encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        tokens += int(batch["attention_mask"].sum())
    return tokens


def codes_digest(fingerprints: list[Fingerprint]) -> str:
    """SHA-256 over every text's token codes, in text order."""
    digest = hashlib.sha256()
    for fingerprint in fingerprints:
        digest.update(np.asarray(fingerprint.token_codes, dtype=np.int64).tobytes())
        digest.update(b"|")
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, help="exported fingerprinter directory")
    parser.add_argument("--data", choices=("locomo", "dailydialog"), default="locomo")
    parser.add_argument("--path", help="the data file (default: the shared LoCoMo dev file or DailyDialog "
                                       "validation)")
    parser.add_argument("--texts", type=within(int, 0), default=512, help="first N texts (0: all)")
    parser.add_argument("--rounds", type=within(int, 2), default=5,
                        help="timed rounds (at least 2: a spread)")
    parser.add_argument("--batch-size", type=within(int, 1), default=64)
    parser.add_argument("--threads", type=within(int, 1), default=torch.get_num_threads())
    add_json_option(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    try:  # a missing or malformed checkpoint or data file: one error line, as for a bad value
        texts = load_texts(args.data, args.path, args.texts)
        fingerprinter = Fingerprinter.from_pretrained(args.checkpoint)
    except (OSError, ValueError) as err:
        parser.error(str(err))
    warmup = texts[: args.batch_size]
    encode_only(fingerprinter, warmup, args.batch_size)
    fingerprinter.fingerprint(warmup, args.batch_size)

    digests: set[str] = set()
    tokens: list[int] = []
    seconds = interleaved_rounds({
        "encoder": lambda _: tokens.append(encode_only(fingerprinter, texts, args.batch_size)),
        "fingerprint": lambda _: digests.add(codes_digest(fingerprinter.fingerprint(texts, args.batch_size))),
    }, args.rounds)
    encoder_rate = [len(texts) / s for s in seconds["encoder"]]
    fingerprint_rate = [len(texts) / s for s in seconds["fingerprint"]]
    ratio = ratio_spread(fingerprint_rate, encoder_rate)
    figures = {
        "fingerprint_texts_per_s": spread(fingerprint_rate)["median"],
        "encoder_texts_per_s": spread(encoder_rate)["median"],
        "ratio": ratio["median"],
        "ratio_spread": ratio,
        "fingerprint_texts_per_s_spread": spread(fingerprint_rate),
        "encoder_texts_per_s_spread": spread(encoder_rate),
        "texts": len(texts),
        "real_tokens": tokens[0],
        "rounds": args.rounds,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "data": args.data,
        "checkpoint": args.checkpoint,
        "codes_sha256": digests.pop() if len(digests) == 1 else "differs between rounds",
    }
    print(f"torch {torch.__version__}, {args.threads} threads; {len(texts)} {args.data} texts, "
          f"{tokens[0]} real tokens, batches of {args.batch_size}, {args.rounds} rounds")
    print(f"encoder      {figures['encoder_texts_per_s']:8.1f} texts/s (median)")
    print(f"fingerprint  {figures['fingerprint_texts_per_s']:8.1f} texts/s (median)")
    print(describe_ratio("fingerprint / encoder texts/s", ratio, "goal >= 0.8"))
    print(f"token codes SHA-256 {figures['codes_sha256']}")
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
