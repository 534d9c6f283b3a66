"""One quantizer training step vs vector-quantize-pytorch and vs the distance-matmul floor.

    python benchmarks/bench_quantizer.py [--rounds 30] [--steps 5] [--threads 2] [--json PATH]

A step = forward, backward of the commitment loss, EMA update (no entropy term), on 32×64
vectors of dim 256 with 1024 codes. The baseline is lucidrains' ``VectorQuantize`` configured
the same (decay 0.99, dead-code threshold 1.0, no rotation trick, commitment 0.1), installed
through the ``bench`` extra; the floor is the n×d×N_c distance matmul alone. The three are
timed round by round, ``--steps`` steps each per round in rotated order, so a load change on a
shared machine hits all three alike; ratios are medians of the per-round ratios, with spread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.arguments import add_json_option, within  # noqa: E402
from benchmarks.timing import describe_ratio, interleaved_rounds, ratio_spread, write_json  # noqa: E402
from isq.quantizer import EMAQuantizer  # noqa: E402


def repeated(step: Callable[[], None], steps: int) -> Callable[[int], None]:
    def call(_: int) -> None:
        for _ in range(steps):
            step()
    return call


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=within(int, 2), default=30,
                        help="timed rounds (at least 2: a spread)")
    parser.add_argument("--steps", type=within(int, 1), default=5, help="steps of each variant per round")
    parser.add_argument("--warmup", type=within(int, 0), default=5)
    parser.add_argument("--threads", type=within(int, 1), default=torch.get_num_threads())
    parser.add_argument("--batch", type=within(int, 1), default=32)
    parser.add_argument("--length", type=within(int, 1), default=64)
    parser.add_argument("--dim", type=within(int, 1), default=256)
    parser.add_argument("--codes", type=within(int, 2), default=1024)
    add_json_option(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = (args.batch, args.length, args.dim)
    z = torch.randn(*shape, requires_grad=True)
    mask = torch.ones(shape[:2], dtype=torch.bool)

    ours = EMAQuantizer(args.codes, args.dim, ema_decay=0.99, beta=0.10, revive_threshold=1.0).train()

    def ours_step() -> None:
        out = ours(z, mask, with_entropy=False)
        out.vq_loss.backward()
        z.grad = None

    from vector_quantize_pytorch import VectorQuantize

    theirs = VectorQuantize(
        dim=args.dim, codebook_size=args.codes, decay=0.99, commitment_weight=0.1,
        threshold_ema_dead_code=1, rotation_trick=False,
    ).train()

    def theirs_step() -> None:
        _, _, loss = theirs(z, mask=mask)
        loss.sum().backward()
        z.grad = None

    flat = torch.randn(args.batch * args.length, args.dim)
    codebook = torch.randn(args.codes, args.dim)

    def floor_step() -> None:
        flat @ codebook.t()

    steps = {"floor": floor_step, "ours": ours_step, "theirs": theirs_step}
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    variants = {name: repeated(step, args.steps) for name, step in steps.items()}
    seconds = interleaved_rounds(variants, args.rounds)
    per_step_ms = {name: 1e3 * statistics.median(s) / args.steps for name, s in seconds.items()}
    vs_theirs = ratio_spread(seconds["ours"], seconds["theirs"])
    vs_floor = ratio_spread(seconds["ours"], seconds["floor"])
    n = args.batch * args.length
    print(f"torch {torch.__version__}, {args.threads} threads, {n}x{args.dim} vectors, {args.codes} codes, "
          f"{args.rounds} rounds of {args.steps} steps")
    print(f"matmul floor ({n}x{args.dim}x{args.codes}) : {per_step_ms['floor']:8.3f} ms (median)")
    print(f"EMAQuantizer step                  : {per_step_ms['ours']:8.3f} ms")
    print(f"vector-quantize-pytorch step        : {per_step_ms['theirs']:8.3f} ms")
    print(describe_ratio("ratio ours / vector-quantize-pytorch", vs_theirs, "goal <= 0.6"))
    print(describe_ratio("ratio ours / matmul floor           ", vs_floor, "goal <= 2.5"))
    write_json(args.json, {
        "floor_ms": per_step_ms["floor"], "ours_ms": per_step_ms["ours"], "theirs_ms": per_step_ms["theirs"],
        "ratio_ours_over_theirs": vs_theirs, "ratio_ours_over_floor": vs_floor,
        "settings": vars(args), "torch": torch.__version__,
    })


if __name__ == "__main__":
    main()
