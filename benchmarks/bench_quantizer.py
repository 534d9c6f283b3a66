"""One quantizer training step vs vector-quantize-pytorch and vs the distance-matmul floor.

    python benchmarks/bench_quantizer.py [--repeats 50] [--threads 2]

A step = forward, backward of the commitment loss, EMA update (no entropy term), on 32×64
vectors of dim 256 with 1024 codes. The baseline is lucidrains' ``VectorQuantize`` configured
the same (decay 0.99, dead-code threshold 1.0, no rotation trick, commitment 0.1), installed
through the ``bench`` extra. Figures are medians; ratios are taken within this run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from isq.quantizer import EMAQuantizer


def median_seconds(step: Callable[[], None], repeats: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--codes", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = (args.batch, args.length, args.dim)
    z = torch.randn(*shape, requires_grad=True)
    mask = torch.ones(shape[:2], dtype=torch.bool)

    ours = EMAQuantizer(args.codes, args.dim, decay=0.99, beta=0.10, revive_threshold=1.0).train()

    def ours_step() -> None:
        out = ours(z, mask, with_entropy=False)
        (out.codebook_loss + ours.beta * out.commitment_loss).backward()
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

    t_floor = median_seconds(floor_step, args.repeats)
    t_ours = median_seconds(ours_step, args.repeats)
    t_theirs = median_seconds(theirs_step, args.repeats)
    n = args.batch * args.length
    print(f"torch {torch.__version__}, {args.threads} threads, {n}x{args.dim} vectors, {args.codes} codes")
    print(f"matmul floor ({n}x{args.dim}x{args.codes}) : {t_floor * 1e3:8.3f} ms")
    print(f"EMAQuantizer step                  : {t_ours * 1e3:8.3f} ms")
    print(f"vector-quantize-pytorch step        : {t_theirs * 1e3:8.3f} ms")
    print(f"ratio ours / vector-quantize-pytorch: {t_ours / t_theirs:6.2f}  (goal <= 0.6)")
    print(f"ratio ours / matmul floor           : {t_ours / t_floor:6.2f}  (goal <= 2.5)")


if __name__ == "__main__":
    main()
