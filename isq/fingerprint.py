"""Frozen fingerprinter: text -> discrete code sequence S_fp and code set U_fp (docs/design.md §2.1).

An exported fingerprinter is a directory in the ``save_pretrained`` style:

- ``config.json``       ISQ config, codebook identity, encoder reference or architecture
- ``model.safetensors`` projection + codebook, and the encoder unless it is referenced
- tokenizer files
- ``training_run.json`` the record of the run that produced it (data, steps, metrics)

A frozen pretrained encoder that lives in a local directory (e.g. the offline MiniLM package)
is *referenced* (path + SHA-256 of its weights, verified on load) rather than copied, so small
fingerprinters can live in git. A trained encoder is always saved. Loading is strict and
verified (:mod:`isq.export`): a fingerprinter that loads gives the codes it was exported with.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from isq import export
from isq.batches import encode_batches
from isq.codebook import Codebook
from isq.codes import Fingerprint
from isq.config import ISQConfig
from isq.encoder import (
    SemanticEncoder,
    build_encoder,
    config_checksum,
    is_adapter,
    resolve_encoder_path,
    weights_checksum,
)
from isq.identity import ENCODER_KEY

FINGERPRINT_BATCH = 64
"""Texts per forward of :meth:`Fingerprinter.fingerprint` unless the caller says otherwise."""


class Fingerprinter(nn.Module):
    """Tokenizer + encoder + stride-1 projection + codebook, frozen and in eval mode."""

    def __init__(
        self,
        config: ISQConfig,
        tokenizer: PreTrainedTokenizerBase,
        semantic_encoder: SemanticEncoder,
        codebook: Codebook | Tensor,
    ) -> None:
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer
        self.semantic_encoder = copy.deepcopy(semantic_encoder)
        vectors = codebook.vectors if isinstance(codebook, Codebook) else codebook
        self.codebook = Codebook.from_vectors(vectors)
        self.run_record: dict[str, Any] | None = None
        self._encoder_sha256: str | None = None
        self.requires_grad_(False)
        self.eval()

    # ------------------------------------------------------------------ identity
    @property
    def codebook_size(self) -> int:
        return self.codebook.num_codes

    @property
    def identity(self) -> dict[str, Any]:
        """What a memory bank records to refuse a different fingerprinter later: the codebook
        (:mod:`isq.identity`) and the encoder part that turns text into the vectors it codes."""
        vectors = self.codebook.vectors.detach().cpu().contiguous().numpy()
        return {"codebook_size": self.codebook_size,
                "codebook_sha256": hashlib.sha256(vectors.tobytes()).hexdigest(),
                ENCODER_KEY: self.encoder_sha256}

    @property
    def encoder_sha256(self) -> str:
        """SHA-256 of what maps a text to the vectors the codebook codes: the tokenizer's class,
        vocabulary and case folding, the maximum length, the projection's normalisation and every
        tensor of the semantic encoder (weights, projection, running statistics). Computed once
        (a fingerprinter is frozen; loading weights computes it again)."""
        if self._encoder_sha256 is None:
            digest = hashlib.sha256()
            vocabulary = sorted(self.tokenizer.get_vocab().items())
            digest.update(repr((type(self.tokenizer).__name__, getattr(self.tokenizer, "do_lower_case", None),
                                vocabulary, self.config.max_length,
                                self.config.normalize_projection)).encode())
            for name, tensor in sorted(self.semantic_encoder.state_dict().items()):
                digest.update(name.encode())
                digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            self._encoder_sha256 = digest.hexdigest()
        return self._encoder_sha256

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        self._encoder_sha256 = None
        return super().load_state_dict(*args, **kwargs)

    @property
    def device(self) -> torch.device:
        return self.codebook.vectors.device

    # ------------------------------------------------------------------ inference
    @torch.inference_mode()
    def token_codes(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Nearest-code index per token (B, L); -1 at padding."""
        z = self.semantic_encoder(input_ids, attention_mask)
        return self._codes(z, attention_mask)

    def _codes(self, z: Tensor, attention_mask: Tensor) -> Tensor:
        indices = self.codebook.nearest(z.reshape(-1, z.shape[-1])).indices
        return indices.reshape(z.shape[:-1]).masked_fill(~attention_mask.bool(), -1)

    def _rows(self, z: Tensor, attention_mask: Tensor) -> list[Fingerprint]:
        codes = self._codes(z, attention_mask).cpu().numpy()
        mask = attention_mask.bool().cpu().numpy()
        return [Fingerprint.from_token_codes(codes[row][mask[row]]) for row in range(codes.shape[0])]

    def fingerprint(self, texts: Sequence[str], batch_size: int = FINGERPRINT_BATCH) -> list[Fingerprint]:
        """Fingerprints of ``texts``. Texts longer than ``config.max_length`` tokens are truncated."""
        if isinstance(texts, str):
            raise TypeError("fingerprint() takes a sequence of texts, not a single string")
        results: list[Fingerprint | None] = [None] * len(texts)
        for batch in encode_batches(self.semantic_encoder, self.tokenizer, texts, self.config.max_length,
                                    batch_size):
            for position, printed in zip(batch.positions, self._rows(batch.z, batch.attention_mask),
                                         strict=True):
                results[position] = printed
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def states_and_prints(self, input_ids: Tensor,
                          attention_mask: Tensor) -> tuple[Tensor, list[Fingerprint]]:
        """One tokenized batch's encoder token states (B, L, width) and its fingerprints from
        them: the forward of :meth:`fingerprint`, its states kept for a caller that also pools
        them (:mod:`retrieval.index.joint`)."""
        encoder = self.semantic_encoder.encoder
        hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return hidden, self._rows(self.semantic_encoder.projection(hidden, attention_mask), attention_mask)

    # ------------------------------------------------------------------ persistence
    def references_encoder(self) -> bool:
        """A frozen pretrained encoder in a local directory is referenced, not saved, while its
        weights are the installed ones (a warm start from a fingerprinter with a trained encoder
        loads others: those are saved, or a reload would fingerprint with the installed ones)."""
        if not (self.semantic_encoder.frozen and self.config.encoder_is_pretrained):
            return False
        if not Path(resolve_encoder_path(self.config.encoder)).is_dir():
            return False
        installed = build_encoder(self.config).state_dict()
        ours = {key.replace(".base_layer.", "."): tensor
                for key, tensor in self.semantic_encoder.encoder.state_dict().items() if not is_adapter(key)}
        return ours.keys() == installed.keys() and all(
            torch.equal(tensor.cpu(), installed[key]) for key, tensor in ours.items())

    def stored_tensors(self, encoder_referenced: bool) -> dict[str, Tensor]:
        """The state that goes to disk: one name per storage (tied embeddings once), and of a
        referenced encoder only its adapters."""
        stored: dict[str, Tensor] = {}
        seen: set[int] = set()
        for key, tensor in self.state_dict().items():
            if encoder_referenced and key.startswith("semantic_encoder.encoder.") and not is_adapter(key):
                continue
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            stored[key] = tensor
        return stored

    def save_pretrained(self, directory: str | Path, run_record: dict[str, Any] | None = None, *,
                        overwrite: bool = False) -> Path:
        """Write the directory atomically (complete or not at all); an existing, non-empty
        directory raises :class:`isq.export.ExportExistsError` unless ``overwrite`` and it holds
        an earlier export."""
        reference = None
        if self.references_encoder():
            installed = resolve_encoder_path(self.config.encoder)
            reference = {"encoder": self.config.encoder, "sha256": weights_checksum(installed),
                         "config_sha256": config_checksum(installed)}
        meta = {
            "isq_config": self.config.to_dict(),
            "encoder_reference": reference,
            "encoder_architecture": None if reference else self.semantic_encoder.encoder.config.to_dict(),
            "frozen_encoder": self.semantic_encoder.frozen,
            "identity": self.identity,
        }
        return export.write_directory(Path(directory), self.stored_tensors(bool(reference)), meta,
                                      lambda staging: self.tokenizer.save_pretrained(str(staging)),
                                      run_record, overwrite=overwrite)

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu") -> Fingerprinter:
        """Load and verify: required files present, every tensor present, of its shape and
        finite, the codebook equal to its recorded checksum, a referenced encoder equal to the
        installed one. Every failure is one :class:`isq.export.FingerprinterLoadError` (a
        ValueError) naming the file and the field."""
        directory = Path(directory)
        meta = export.read_meta(directory)
        where = directory / export.CONFIG_NAME
        try:
            config = ISQConfig.from_dict(meta["isq_config"])
        except ValueError as err:
            raise export.FingerprinterLoadError(f"{where}: field 'isq_config': {err}") from None
        export.check_codebook_shape(directory, (config.num_codes, config.code_dim))
        reference = meta.get("encoder_reference")
        try:
            if reference:
                _check_reference(where, reference)
                encoder = build_encoder(config)
            else:
                encoder = build_encoder(config, architecture=meta.get("encoder_architecture"))
            tokenizer = _listed_tokenizer(directory, meta)
            semantic = SemanticEncoder.build(config, encoder, frozen=bool(meta["frozen_encoder"]))
        except (OSError, KeyError, TypeError, ValueError, RuntimeError, MemoryError) as err:
            if isinstance(err, export.FingerprinterLoadError):
                raise
            raise export.FingerprinterLoadError(  # RuntimeError, MemoryError: more than memory holds
                f"{where}: cannot build the encoder or tokenizer ({str(err)[:300]})") from None
        model = cls(config, tokenizer, semantic, torch.zeros(config.num_codes, config.code_dim))
        expected = model.stored_tensors(bool(reference))
        # Not strict: tied copies and a referenced encoder are absent on
        # purpose; read_tensors checked the rest.
        model.load_state_dict(export.read_tensors(directory, expected), strict=False)
        export.check_identity(directory, meta["identity"], model.identity)
        model.run_record = export.read_run_record(directory)
        return model.to(device).eval()


def _listed_tokenizer(directory: Path, meta: dict[str, Any]) -> PreTrainedTokenizerBase:
    """The tokenizer of the export's listed files only (:func:`isq.export.listed_files`, checked
    by their SHA-256): ``from_pretrained`` of the directory would also read files dropped in beside
    them (an ``added_tokens.json`` giving ids past the encoder's vocabulary)."""
    with tempfile.TemporaryDirectory(prefix="isq-tokenizer-") as listed:
        for name in export.listed_files(meta):
            if name != export.WEIGHTS_NAME:
                shutil.copyfile(directory / name, Path(listed) / name)
        return AutoTokenizer.from_pretrained(listed)


def _check_reference(where: Path, reference: dict[str, Any]) -> None:
    """The installed encoder an export references has the weights it was trained with and, where
    the export records it (those written before did not), the same ``config.json``."""
    installed = resolve_encoder_path(reference["encoder"])
    checks = [("weights", weights_checksum(installed), reference["sha256"])]
    if "config_sha256" in reference:
        checks.append(("config.json", config_checksum(installed), reference["config_sha256"]))
    for what, found, recorded in checks:
        if found != recorded:
            raise export.FingerprinterLoadError(
                f"{where}: the installed encoder {reference['encoder']!r} has {what} SHA-256 {found[:12]}…, "
                f"but this fingerprinter was trained with {str(recorded)[:12]}…")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m isq.fingerprint DIR TEXT [TEXT ...]``: print S_fp and |U_fp| per text."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m isq.fingerprint", description=main.__doc__)
    parser.add_argument("directory", help="exported fingerprinter directory")
    parser.add_argument("texts", nargs="+")
    args = parser.parse_args(argv)
    try:
        fingerprinter = Fingerprinter.from_pretrained(args.directory)
    except (OSError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    for text, fp in zip(args.texts, fingerprinter.fingerprint(args.texts), strict=True):
        print(f"{text!r}\n  L={len(fp.token_codes)} |S_fp|={len(fp.sequence)} |U_fp|={len(fp.codes)}"
              f"\n  S_fp={list(fp.sequence)}")


if __name__ == "__main__":
    main()
