"""Frozen fingerprinter: text -> discrete code sequence S_fp and code set U_fp (SPEC section 2).

An exported fingerprinter is a directory in the ``save_pretrained`` style:

- ``config.json``       ISQ config, codebook identity, encoder reference or architecture
- ``model.safetensors`` projection + codebook, and the encoder unless it is referenced
- tokenizer files
- ``training_run.json`` the record of the run that produced it (data, steps, metrics)

A frozen pretrained encoder that lives in a local directory (e.g. the offline MiniLM package)
is *referenced* (path + SHA-256 of its weights, verified on load) rather than copied, so small
fingerprinters can live in git. A trained encoder is always saved.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from isq.encoders import resolve_encoder_path, weights_checksum
from isq.model import ISQConfig, SemanticEncoder, build_encoder, encoder_width
from isq.projection import StrideOneProjection
from isq.quantizer import fp32_island, squared_distances

FORMAT_VERSION = 1
WEIGHTS_NAME = "model.safetensors"
RUN_RECORD_NAME = "training_run.json"


@dataclass(frozen=True)
class Fingerprint:
    """Codes of one text.

    ``token_codes``: one code per non-padding token (length L, before de-duplication);
    ``sequence``: S_fp, consecutive repeats removed; ``codes``: U_fp, the set of distinct codes.
    """

    token_codes: tuple[int, ...]
    sequence: tuple[int, ...]
    codes: frozenset[int]


def collapse_repeats(token_codes: Sequence[int]) -> tuple[int, ...]:
    """S_fp: drop a code equal to the one before it."""
    return tuple(c for i, c in enumerate(token_codes) if i == 0 or c != token_codes[i - 1])


class Fingerprinter(nn.Module):
    """Tokenizer + encoder + stride-1 projection + codebook, frozen and in eval mode."""

    def __init__(
        self,
        config: ISQConfig,
        tokenizer: PreTrainedTokenizerBase,
        semantic_encoder: SemanticEncoder,
        codebook: Tensor,
    ) -> None:
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer
        self.semantic_encoder = copy.deepcopy(semantic_encoder)
        self.register_buffer("codebook", codebook.detach().float().clone())
        self.requires_grad_(False)
        self.eval()

    # ------------------------------------------------------------------ identity
    @property
    def codebook_size(self) -> int:
        return int(self.codebook.shape[0])

    @property
    def identity(self) -> dict[str, Any]:
        """What a memory bank records to refuse a different fingerprinter later."""
        digest = hashlib.sha256(self.codebook.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
        return {"codebook_size": self.codebook_size, "codebook_sha256": digest}

    @property
    def device(self) -> torch.device:
        return self.codebook.device

    # ------------------------------------------------------------------ inference
    @torch.inference_mode()
    def token_codes(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Nearest-code index per token (B, L); -1 at padding."""
        z = self.semantic_encoder(input_ids, attention_mask)
        with fp32_island():
            idx = squared_distances(z.float().reshape(-1, z.shape[-1]), self.codebook).argmin(1)
        return idx.reshape(z.shape[:-1]).masked_fill(~attention_mask.bool(), -1)

    def fingerprint(self, texts: Sequence[str], batch_size: int = 64) -> list[Fingerprint]:
        """Fingerprints of ``texts``. Texts longer than ``config.max_length`` tokens are truncated."""
        if isinstance(texts, str):
            raise TypeError("fingerprint() takes a sequence of texts, not a single string")
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # length-sorted batches pad less
        results: list[Fingerprint | None] = [None] * len(texts)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batch = self.tokenizer(
                [texts[i] for i in chunk], padding=True, truncation=True,
                max_length=self.config.max_length, return_tensors="pt",
            ).to(self.device)
            codes = self.token_codes(batch["input_ids"], batch["attention_mask"]).cpu()
            for row, i in enumerate(chunk):
                token_codes = tuple(int(c) for c in codes[row] if c >= 0)
                results[i] = Fingerprint(token_codes, collapse_repeats(token_codes), frozenset(token_codes))
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ persistence
    def _references_encoder(self) -> bool:
        if not (self.semantic_encoder.frozen and self.config.encoder_is_pretrained):
            return False
        return Path(resolve_encoder_path(self.config.encoder)).is_dir()

    def _stored_tensors(self, encoder_referenced: bool) -> dict[str, Tensor]:
        """The state that goes to disk: one name per storage (tied embeddings once), and no
        encoder weights when the encoder is referenced."""
        stored: dict[str, Tensor] = {}
        seen: set[int] = set()
        for key, tensor in self.state_dict().items():
            if encoder_referenced and key.startswith("semantic_encoder.encoder."):
                continue
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            stored[key] = tensor
        return stored

    def save_pretrained(self, directory: str | Path, run_record: dict[str, Any] | None = None) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        reference = None
        if self._references_encoder():
            reference = {"encoder": self.config.encoder,
                         "sha256": weights_checksum(resolve_encoder_path(self.config.encoder))}
        tensors = {k: v.detach().cpu().contiguous() for k, v in self._stored_tensors(bool(reference)).items()}
        save_file(tensors, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
        meta = {
            "format_version": FORMAT_VERSION,
            "isq_config": self.config.to_dict(),
            "encoder_reference": reference,
            "encoder_architecture": None if reference else self.semantic_encoder.encoder.config.to_dict(),
            "frozen_encoder": self.semantic_encoder.frozen,
            "identity": self.identity,
        }
        (directory / "config.json").write_text(json.dumps(meta, indent=2, default=str))
        self.tokenizer.save_pretrained(str(directory))
        if run_record is not None:
            (directory / RUN_RECORD_NAME).write_text(json.dumps(run_record, indent=2, default=str))
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu") -> Fingerprinter:
        """Load strictly: every tensor must be present with its shape, else a ValueError names it."""
        directory = Path(directory)
        config_path = directory / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"{directory} is not a fingerprinter directory: {config_path.name} is missing")
        meta = json.loads(config_path.read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{config_path}: unsupported format_version {meta.get('format_version')!r}")
        config = ISQConfig.from_dict(meta["isq_config"])
        reference = meta.get("encoder_reference")
        if reference:
            found = weights_checksum(resolve_encoder_path(reference["encoder"]))
            if found != reference["sha256"]:
                raise ValueError(
                    f"{config_path}: the installed encoder {reference['encoder']!r} has weights SHA-256 "
                    f"{found[:12]}…, but this fingerprinter was trained with {reference['sha256'][:12]}…"
                )
            encoder = build_encoder(config)
        else:
            encoder = build_encoder(config, architecture=meta["encoder_architecture"])
        semantic = SemanticEncoder(
            encoder, StrideOneProjection(encoder_width(encoder), config.code_dim, config.kernel_size,
                                         config.normalize_projection),
            frozen=bool(meta.get("frozen_encoder", False)),
        )
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        model = cls(config, tokenizer, semantic, torch.zeros(config.num_codes, config.code_dim))

        weights_path = directory / WEIGHTS_NAME
        if not weights_path.is_file():
            raise FileNotFoundError(f"{weights_path} is missing")
        saved = load_file(str(weights_path))
        expected = model._stored_tensors(bool(reference))
        missing = sorted(set(expected) - set(saved))
        if missing:
            raise ValueError(f"{weights_path}: missing tensor(s) {', '.join(missing[:5])}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
        unexpected = sorted(set(saved) - set(expected))
        if unexpected:
            raise ValueError(f"{weights_path}: unexpected tensor(s) {', '.join(unexpected[:5])}")
        for key, tensor in expected.items():
            if tuple(saved[key].shape) != tuple(tensor.shape):
                raise ValueError(
                    f"{weights_path}: tensor {key} has shape {tuple(saved[key].shape)}, expected {tuple(tensor.shape)}"
                )
        # Not strict: tied copies and a referenced encoder are absent on purpose; checked above.
        model.load_state_dict(saved, strict=False)
        model.run_record = _read_json(directory / RUN_RECORD_NAME)
        return model.to(device).eval()


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m isq.fingerprint DIR TEXT [TEXT ...]``: print S_fp and |U_fp| per text."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("directory", help="exported fingerprinter directory")
    parser.add_argument("texts", nargs="+")
    args = parser.parse_args(argv)
    try:
        fingerprinter = Fingerprinter.from_pretrained(args.directory)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    for text, fp in zip(args.texts, fingerprinter.fingerprint(args.texts), strict=True):
        print(f"{text!r}\n  L={len(fp.token_codes)} |S_fp|={len(fp.sequence)} |U_fp|={len(fp.codes)}"
              f"\n  S_fp={list(fp.sequence)}")


if __name__ == "__main__":
    main()
