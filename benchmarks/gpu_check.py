"""GPU check of the paper configuration at real size: throughput, memory and MFU of training steps.

The model is the paper's ISQ (``configs/isq_t5base_dailydialog.yaml``) at T5-base size, built
from its config with random weights (no hub access): a T5-base encoder (d_model 768, d_ff 3072,
12 layers, 12 heads, d_kv 64, vocabulary 32128), the stride-1 projection to 1024 codes of
dimension 256, and a T5-base-sized decoder. Each step is what training runs: bf16-mixed forward
(``torch.autocast`` cuda bf16, fp32 weights), backward, gradient clipping at 1.0, AdamW with the
two learning rates of docs/design.md §1.8 (:meth:`isq.model.ISQModel.parameter_groups`: encoder 1e-4, the rest
1e-3), then the quantizer's ``optimizer_step`` (dead-code revival). Batches are synthetic token
ids shaped like the paper config: ``--batch`` contexts of 192 tokens (the paper's 32) and as many targets
of 64, no padding.

MFU = achieved model FLOP/s / the device's dense bf16 peak. Model FLOPs are estimated as
6 x parameters x tokens, for the encoder side (encoder without its token embedding, a lookup,
plus the projection) over context tokens and for the decoder side (decoder including its tied
output layer, plus the up-projection) over target tokens; attention's sequence-length terms and
the codebook lookup are left out, so the estimate is a little low. The peak comes from
``--peak-tflops`` or a table of device names (H100/H200 SXM 989 TFLOP/s dense bf16).

    python benchmarks/gpu_check.py --steps 300 --json perf/gpu_check.json
    python benchmarks/gpu_check.py --steps 60 --profile 5    # then where a step's time goes
    python benchmarks/gpu_check.py --tiny --json /tmp/gpu_check.json   # CPU, tiny model, fp32
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.arguments import add_json_option, within  # noqa: E402
from benchmarks.timing import write_json  # noqa: E402
from isq.config import ISQConfig  # noqa: E402
from isq.model import ISQModel  # noqa: E402

T5_BASE = {"d_model": 768, "d_ff": 3072, "num_heads": 12, "d_kv": 64}
T5_VOCAB = 32128

PEAK_BF16_TFLOPS = (  # dense (no sparsity) bf16 tensor-core peaks; the first name contained wins
    ("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0), ("A100", 312.0),
    ("L40S", 362.0), ("A10", 125.0), ("L4", 121.0),
)


@dataclass
class Shape:
    """One synthetic training batch: ``batch`` contexts of ``context`` tokens, targets of ``target``."""

    batch: int
    context: int
    target: int

    @property
    def tokens(self) -> int:
        return self.batch * (self.context + self.target)


class Vocabulary:
    """What :class:`isq.model.ISQModel` asks of a tokenizer (size and special ids), for token
    ids that never were text."""

    pad_token_id = 0
    eos_token_id = 1
    sep_token_id = None

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def paper_config() -> tuple[ISQConfig, int]:
    encoder = {"model_type": "t5", "vocab_size": T5_VOCAB, "num_layers": 12, **T5_BASE}
    decoder = {"num_decoder_layers": 12, **T5_BASE}
    return ISQConfig(encoder="t5-base (random)", encoder_config=encoder, decoder=decoder), T5_VOCAB


def tiny_config() -> tuple[ISQConfig, int]:
    encoder = {"model_type": "t5", "vocab_size": 512, "d_model": 32, "d_ff": 64, "num_layers": 2,
               "num_heads": 2, "d_kv": 16}
    decoder = {"d_model": 32, "d_ff": 64, "num_decoder_layers": 1, "num_heads": 2, "d_kv": 16}
    return ISQConfig(encoder="tiny t5 (random)", encoder_config=encoder, decoder=decoder, code_dim=16,
                     num_codes=64, max_length=64), 512


def flop_parameters(model: ISQModel) -> dict[str, int]:
    """Parameters that do multiply-adds per token, split by the tokens they see (see the module doc)."""
    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    encoder = cast(PreTrainedModel, model.semantic_encoder.encoder)
    embedding = cast(torch.nn.Embedding, encoder.get_input_embeddings()).weight.numel()
    return {
        "encoder_side": count(model.semantic_encoder) - embedding,
        "decoder_side": count(model.decoder) + count(model.up_projection),
        "total": count(model),
    }


def peak_tflops(device_name: str, given: float | None) -> float | None:
    if given is not None:
        return given
    return next((peak for name, peak in PEAK_BF16_TFLOPS if name in device_name), None)


def synthetic_batch(shape: Shape, vocab: int, device: torch.device,
                    generator: torch.Generator) -> dict[str, torch.Tensor]:
    def ids(length: int) -> torch.Tensor:  # ids 0 and 1 are padding and end of sequence
        return torch.randint(2, vocab, (shape.batch, length), generator=generator).to(device)

    return {"input_ids": ids(shape.context), "attention_mask": torch.ones(shape.batch, shape.context,
                                                                          dtype=torch.long, device=device),
            "labels": ids(shape.target)}


def run(config: ISQConfig, vocab: int, shape: Shape, device: torch.device, bf16: bool, steps: int,
        warmup: int) -> dict[str, Any]:
    """Train ``warmup`` + ``steps`` steps; time the last ``steps`` one by one."""
    torch.manual_seed(0)
    # Vocabulary has what ISQModel reads of a tokenizer (size, special ids), no more
    model = ISQModel(config, cast(PreTrainedTokenizerBase, Vocabulary(vocab))).to(device).train()
    groups = model.parameter_groups()
    optimizer = torch.optim.AdamW([{"params": groups["head"], "lr": 1e-3},
                                   {"params": groups["encoder"], "lr": 1e-4}], weight_decay=0.01)
    generator = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(shape, vocab, device, generator) for _ in range(4)]
    cuda = device.type == "cuda"

    def step(index: int) -> torch.Tensor:
        batch = batches[index % len(batches)]
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with autocast:
            out = model(batch["input_ids"], batch["attention_mask"], batch["labels"])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.quantizer.optimizer_step(out.revival_candidates)
        return out.loss.detach()

    for index in range(warmup):  # includes the quantizer's k-means initialisation on batch 0
        step(index)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    seconds, losses = [], []
    for index in range(warmup, warmup + steps):
        began = time.perf_counter()
        losses.append(step(index))
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - began)
    return {"model": model, "seconds": seconds, "loss": float(losses[-1]), "step": step,
            "next_step": warmup + steps,
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None}


def profile(step: Callable[[int], torch.Tensor], first: int, count: int, cuda: bool,
            step_ms: float) -> dict[str, Any]:
    """Profile ``count`` more steps: the time the device spends in kernels a step, as a share of
    ``step_ms`` (the unprofiled median: the profiler slows the host, not the kernels; the rest of
    a step the device waits on the host's launches and synchronisations), and the operators that
    take most host time and most device time, printed as torch.profiler's tables."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    began = time.perf_counter()
    with torch_profile(activities=activities) as prof:
        for index in range(first, first + count):
            step(index)
        if cuda:
            torch.cuda.synchronize()
    profiled_ms = 1e3 * (time.perf_counter() - began) / count
    figures: dict[str, Any] = {"steps": count, "profiled_step_ms": profiled_ms}
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=12))
    if cuda:
        print(averages.table(sort_by="self_device_time_total", row_limit=12))
        kernel_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
        figures["device_busy_ms"] = kernel_us / 1e3 / count
        figures["device_busy_fraction"] = figures["device_busy_ms"] / step_ms
        print(f"the device is busy in kernels {figures['device_busy_ms']:.1f} ms of a {step_ms:.1f} ms step "
              f"({figures['device_busy_fraction']:.0%}); the rest it waits on the host")
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=within(int, 1), default=300, help="timed optimizer steps")
    parser.add_argument("--warmup", type=within(int, 0), default=10, help="untimed steps first")
    parser.add_argument("--peak-tflops", type=within(float, 1),
                        help="the device's dense bf16 peak in TFLOP/s (default: from its name)")
    parser.add_argument("--tiny", action="store_true", help="tiny random model on CPU, fp32, a few steps")
    parser.add_argument("--batch", type=within(int, 1), default=32,
                        help="contexts a step (the paper's 32; --tiny keeps its own 4)")
    parser.add_argument("--profile", type=within(int, 0), default=0, metavar="N",
                        help="then profile N more steps: device busy time and the costliest operators")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.tiny:
        config, vocab = tiny_config()
        shape, device, bf16 = Shape(4, 16, 8), torch.device("cpu"), False
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
        torch.set_num_threads(1)  # a tiny model gains nothing from threads, and a busy machine slows them
        device_name = "cpu"
    else:
        if not torch.cuda.is_available():
            parser.exit(2, "gpu_check: no CUDA device is available; run it on a GPU machine, or pass --tiny "
                           "for the CPU smoke run\n")
        config, vocab = paper_config()
        shape, device, bf16 = Shape(args.batch, 192, 64), torch.device("cuda"), True
        device_name = torch.cuda.get_device_name(device)

    result = run(config, vocab, shape, device, bf16, args.steps, args.warmup)
    params = flop_parameters(result["model"])
    flops_per_step = 6 * (params["encoder_side"] * shape.batch * shape.context
                          + params["decoder_side"] * shape.batch * shape.target)
    step_s = statistics.median(result["seconds"])
    total_s = sum(result["seconds"])
    achieved = flops_per_step * len(result["seconds"]) / total_s
    peak = peak_tflops(device_name, args.peak_tflops) if bf16 else args.peak_tflops
    figures = {
        "device": device_name,
        "precision": "bf16-mixed" if bf16 else "fp32",
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "batch": shape.batch,
        "context_tokens": shape.context,
        "target_tokens": shape.target,
        "tokens_per_step": shape.tokens,
        "tokens_per_s": shape.tokens * len(result["seconds"]) / total_s,
        "step_ms_median": 1e3 * step_s,
        "peak_memory_bytes": result["peak_memory_bytes"],
        "parameters": params,
        "model_flops_per_step": flops_per_step,
        "achieved_tflops": achieved / 1e12,
        "peak_tflops": peak,
        "mfu": achieved / (peak * 1e12) if peak else None,
        "flops_estimate": "6 x (encoder params without token embedding + projection) x context tokens"
                          " + 6 x (decoder params + up-projection) x target tokens; attention length"
                          " terms left out",
        "final_loss": result["loss"],
        "dead_codes": int(result["model"].quantizer.dead_codes),
    }
    memory = figures["peak_memory_bytes"]
    print(f"{device_name}, {figures['precision']}, {params['total'] / 1e6:.1f} M parameters, "
          f"batch {shape.batch} x ({shape.context} + {shape.target}) tokens, {args.steps} timed steps")
    print(f"step {figures['step_ms_median']:.1f} ms (median), {figures['tokens_per_s']:,.0f} tokens/s, "
          f"peak memory {'n/a' if memory is None else f'{memory / 2**30:.2f} GiB'}")
    mfu = figures["mfu"]
    shown = "n/a (no peak known; pass --peak-tflops)" if mfu is None else f"{mfu:.1%} of {peak:.0f} TFLOP/s"
    print(f"model FLOPs {flops_per_step / 1e12:.2f} TFLOP/step, "
          f"achieved {figures['achieved_tflops']:.1f} TFLOP/s, MFU {shown}")
    print(f"final loss {figures['final_loss']:.3f}, dead codes at the last window {figures['dead_codes']}")
    if args.profile > 0:
        figures["profile"] = profile(result["step"], result["next_step"], args.profile, device.type == "cuda",
                                     figures["step_ms_median"])
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
