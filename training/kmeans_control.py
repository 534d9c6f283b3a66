"""The control codebook: k-means over frozen encoder token states, with no training at all.

Is the predictive-coding training of the codebook what makes Path B work, or would any
codebook over the same encoder do? The control answers that: the same frozen encoder, an
identity projection (z_t = h_t) and N codes placed by k-means on token states of the same
training utterances, packaged as an ordinary fingerprinter directory so that the evaluation
fingerprints and scores it exactly like the trained one.

    python -m training.kmeans_control --encoder offline:all-MiniLM-L6-v2 \\
        --data-root PATH/TO/dailydialog --num-codes 1024 --max-tokens 200000 \\
        --kernel-size 1 --out checkpoints/kmeans_minilm_dailydialog

The CPU training config starts from that directory (``model.init_from``), so step 0 of
training fingerprints exactly like the control.

A frozen offline encoder is referenced by checksum, not copied, so the directory holds only
the projection, the codebook and the tokenizer (a few MB).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch

from isq.batches import encode_batches
from isq.config import ISQConfig
from isq.dailydialog import read_dialogues
from isq.encoder import (
    MINILM_ALIAS,
    SemanticEncoder,
    build_encoder,
    check_max_length,
    encoder_width,
    load_tokenizer,
)
from isq.export import ExportExistsError, refuse_occupied
from isq.fingerprint import Fingerprinter
from isq.outputs import export_directory
from isq.projection import StrideOneProjection

FAISS_POINTS_PER_CODE = 256
"""faiss's default cap on the points it clusters per code (``max_points_per_centroid``)."""

MAX_SEED = 2**31 - 1
"""The largest seed faiss's k-means takes (a C ``int``; 0 up, as the text sampling's)."""


def identity_projection(config: ISQConfig, d_model: int) -> StrideOneProjection:
    """A stride-1 projection d_model -> d_model that passes each token state through unchanged:
    identity on the centre tap of the kernel, zero on the other taps, zero bias."""
    projection = StrideOneProjection(d_model, d_model, config.kernel_size, config.normalize_projection)
    with torch.no_grad():
        projection.conv.weight.zero_()
        projection.conv.weight[:, :, config.kernel_size // 2] = torch.eye(d_model)
        assert projection.conv.bias is not None  # StrideOneProjection's conv has a bias
        projection.conv.bias.zero_()
    return projection


def sample_texts(texts: Sequence[str], tokenizer: Any, max_tokens: int, max_length: int,
                 seed: int) -> list[str]:
    """Texts in a seeded random order, just enough of them to hold ``max_tokens`` non-padding
    tokens (as the fingerprinter tokenizes them: special tokens included, truncated)."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    chosen: list[str] = []
    total = 0
    for index in order:
        if total >= max_tokens:
            break
        chosen.append(texts[index])
        total += len(tokenizer(texts[index], truncation=True, max_length=max_length)["input_ids"])
    return chosen


def token_states(semantic_encoder: SemanticEncoder, tokenizer: Any, texts: Sequence[str], max_length: int,
                 batch_size: int = 64) -> np.ndarray:
    """z_t of every non-padding token of ``texts`` (float32, tokens x code_dim), texts in order of
    length (the order of :func:`isq.batches.encode_batches`)."""
    rows = [batch.z[batch.mask].float().numpy()
            for batch in encode_batches(semantic_encoder, tokenizer, texts, max_length, batch_size)]
    return np.concatenate(rows) if rows else np.zeros((0, 0), dtype=np.float32)


@torch.inference_mode()
def _check_identity(semantic_encoder: SemanticEncoder, tokenizer: Any, texts: Sequence[str],
                    config: ISQConfig) -> None:
    """z must equal the encoder's h at real tokens, else the config normalises the projection."""
    batch = tokenizer(list(texts), padding=True, truncation=True, max_length=config.max_length,
                      return_tensors="pt")
    mask = batch["attention_mask"].bool()
    hidden = semantic_encoder.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    z = semantic_encoder(batch["input_ids"], batch["attention_mask"])
    if not torch.allclose(z[mask], hidden.last_hidden_state[mask], atol=1e-5):
        raise ValueError("the projection does not pass token states through unchanged: the k-means control "
                         f"needs normalize_projection off (got {config.normalize_projection!r})")


def build_kmeans_fingerprinter(config: ISQConfig, texts: Sequence[str], *, max_tokens: int = 200_000,
                               seed: int = 0, niter: int = 20, batch_size: int = 64,
                               projection_from: Fingerprinter | None = None) -> tuple[Fingerprinter,
                                                                                      dict[str, Any]]:
    """Texts -> frozen-encoder token states -> k-means -> an untrained :class:`Fingerprinter`.

    ``config`` names the encoder, tokenizer, ``num_codes``, ``kernel_size`` and ``max_length``;
    ``freeze_encoder`` and ``code_dim`` (= the encoder width) are set here. Token states of a
    seeded random subset of ``texts`` holding ``max_tokens`` non-padding tokens (the surplus,
    less than one text, is cut from the longest) are clustered by ``faiss.Kmeans`` with ``seed`` and ``niter``
    iterations; the centroids become the codebook. Returns the fingerprinter and a record of the run.

    ``projection_from`` (a trained fingerprinter) replaces the identity projection by that
    fingerprinter's encoder + projection: k-means then runs on its z_t, which separates what
    training did to the projection from what it did to the codebook. Its tokenizer,
    ``code_dim``, ``kernel_size``, normalisation and ``max_length`` are used; ``config``
    gives only ``num_codes``.
    """
    started = time.perf_counter()
    if projection_from is None:
        tokenizer = load_tokenizer(config)
        encoder = build_encoder(config)
        check_max_length(config, encoder)  # before the texts are encoded, not when the export is loaded
        d_model = encoder_width(encoder)
        config = dataclasses.replace(config, freeze_encoder=True, code_dim=d_model)
        semantic = SemanticEncoder(encoder, identity_projection(config, d_model), frozen=True).eval()
    else:
        tokenizer, semantic, d_model = (projection_from.tokenizer, projection_from.semantic_encoder,
                                        projection_from.config.code_dim)
        config = dataclasses.replace(projection_from.config, num_codes=config.num_codes)
    chosen = sample_texts(texts, tokenizer, max_tokens, config.max_length, seed)
    if projection_from is None:
        _check_identity(semantic, tokenizer, chosen[:batch_size], config)
    states = np.ascontiguousarray(token_states(semantic, tokenizer, chosen, config.max_length,
                                               batch_size)[:max_tokens])
    if states.shape[0] < config.num_codes:
        raise ValueError(f"{states.shape[0]} token states cannot place {config.num_codes} codes; "
                         "give more texts or a larger max_tokens")
    encoded_s = time.perf_counter() - started
    # faiss samples at most max_points_per_centroid (default 256) points a code and clusters only
    # those; raised to cover every state, every state is clustered (where the default covers them
    # all already, the default is kept and so is the clustering)
    points = max(FAISS_POINTS_PER_CODE, math.ceil(states.shape[0] / config.num_codes))
    kmeans = faiss.Kmeans(d_model, config.num_codes, niter=niter, seed=seed, verbose=False,
                          max_points_per_centroid=points)
    kmeans.train(states)
    objective = float(kmeans.obj[-1]) if kmeans.obj is not None else None  # faiss records it per iteration
    _, assignment = kmeans.index.search(states, 1)
    codebook = torch.from_numpy(np.array(kmeans.centroids, dtype=np.float32))
    fingerprinter = Fingerprinter(config, tokenizer, semantic, codebook)
    record = {
        "kind": "kmeans_control",
        "projection": "identity" if projection_from is None else "trained",
        "texts_available": len(texts),
        "texts_used": len(chosen),
        "tokens": int(states.shape[0]),  # every one clustered
        "num_codes": config.num_codes,
        "codes_used": int(np.unique(assignment).size),
        "kmeans": {"niter": niter, "seed": seed, "objective": objective,
                   "faiss_version": faiss.__version__},
        "seconds": {"encode": round(encoded_s, 1), "total": round(time.perf_counter() - started, 1)},
    }
    return fingerprinter, record


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.kmeans_control",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--encoder", default=MINILM_ALIAS,
                        help="encoder name or path (default: offline MiniLM)")
    parser.add_argument("--data-root", type=Path, required=True,
                        help="DailyDialog release directory (train/dialogues_train.txt is read)")
    parser.add_argument("--num-codes", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=200_000, help="non-padding tokens clustered")
    parser.add_argument("--max-length", type=int, default=256,
                        help="truncation length, as the trained CPU fingerprinter "
                             "(configs/isq_minilm_dailydialog_cpu)")
    parser.add_argument("--kernel-size", type=int, default=1,
                        help="projection kernel (identity on the centre tap, "
                             "so the codes do not depend on it); "
                             "match the config of a run that will start from this control "
                             "(--model.init_from)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--niter", type=int, default=20, help="k-means iterations")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--projection-from", type=Path, default=None,
                        help="a trained fingerprinter directory: cluster its projected z_t instead of the "
                             "encoder's h_t (its encoder, projection and max length are used)")
    parser.add_argument("--out", type=export_directory, required=True,
                        help="fingerprinter directory to write (refused if it exists and is not empty)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export at --out")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.kernel_size < 1 or args.kernel_size % 2 == 0:
        parser.error(f"--kernel-size must be a positive odd number (the projection keeps the length), "
                     f"got {args.kernel_size}")
    try:
        refuse_occupied(args.out, args.overwrite, "pass --overwrite to replace it")
    except ExportExistsError as err:
        print(f"error: --out {err}", file=sys.stderr)
        return 2
    train_file = args.data_root / "train" / "dialogues_train.txt"
    counts = (("--max-tokens", args.max_tokens), ("--niter", args.niter), ("--batch-size", args.batch_size))
    for flag, value in counts:
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"--seed must be from 0 to {MAX_SEED} (faiss takes a C int), got {args.seed}")
    try:
        utterances = [turn for dialogue in read_dialogues(train_file) for turn in dialogue]
        config = ISQConfig(encoder=args.encoder, num_codes=args.num_codes, max_length=args.max_length,
                           kernel_size=args.kernel_size)
        trained = None
        if args.projection_from is not None:
            try:
                trained = Fingerprinter.from_pretrained(args.projection_from)
            except (OSError, ValueError) as err:
                raise ValueError(f"--projection-from: {err}") from None
        fingerprinter, record = build_kmeans_fingerprinter(
            config, utterances, max_tokens=args.max_tokens, seed=args.seed, niter=args.niter,
            batch_size=args.batch_size, projection_from=trained)
    except (OSError, ValueError) as err:  # a missing file or encoder, a setting out of range, too few tokens
        print(f"error: {err}", file=sys.stderr)
        return 2
    record = {
        "exported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python -m training.kmeans_control " + " ".join(sys.argv[1:] if argv is None else argv),
        "data": {"root": str(args.data_root), "split": "train", "file": str(train_file)},
        **record,
    }
    fingerprinter.save_pretrained(args.out, run_record=record, overwrite=args.overwrite)
    print(f"k-means control: {record['tokens']} tokens from {record['texts_used']} utterances, "
          f"{record['codes_used']}/{record['num_codes']} codes used, "
          f"{record['seconds']['total']} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
