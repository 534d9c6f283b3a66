"""The fingerprinter directory on disk: atomic, never-overwriting writes and verified reads.

Format 3 (written now) records the SHA-256 of every file it writes in ``config.json``
(``files``), so a truncated or edited weight file or a missing tokenizer file is refused by
name, and the SHA-256 of ``config.json``'s own fields (``config_sha256``): they hold settings no
file checksum covers and that change the codes (a LoRA adapter's ``lora_alpha``, a saved
encoder's architecture). Format 2 (the committed exports) has the file checksums only. Format 1
(the first exports) has no checksums; it is read with the checks that need none: required files
present, every tensor present, of its shape and finite, and the codebook equal to the recorded
codebook checksum.

Nothing here imports the fingerprinter: :mod:`isq.fingerprint` builds on these functions.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save
from torch import Tensor

from isq.identity import ENCODER_KEY, IDENTITY_KEYS

FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
RUN_RECORD_NAME = "training_run.json"
TOKENIZER_NAMES = ("tokenizer.json", "tokenizer_config.json")
"""What ``tokenizer.save_pretrained`` writes for a fast tokenizer (and format 1 requires)."""
CONFIG_KEY = "config_sha256"
"""The field of ``config.json`` holding the SHA-256 of its other fields (:func:`config_checksum`)."""
META_FIELDS = {"isq_config": dict, "identity": dict, "frozen_encoder": bool}
CODEBOOK_KEY = "codebook.vectors"
LEGACY_KEYS = {"codebook": CODEBOOK_KEY}
"""Format 1 stored the codebook as a bare tensor; it is now a Codebook module's buffer."""


class FingerprinterLoadError(ValueError):
    """A fingerprinter directory cannot be used; the message names the file and the field."""


class ExportExistsError(FileExistsError):
    """The export directory exists and holds files; pass ``overwrite=True`` to replace it."""


class NonFiniteWeights(ValueError):
    """A tensor to export holds NaN or infinite values (the training diverged): nothing is written,
    since no fingerprinter could load it."""


def config_checksum(meta: Mapping[str, Any]) -> str:
    """SHA-256 of ``config.json``'s fields but :data:`CONFIG_KEY`, as JSON reads them back (keys
    sorted, no spaces): the same for the fields written and the file's text read again."""
    fields = json.loads(json.dumps({k: v for k, v in meta.items() if k != CONFIG_KEY}, default=str))
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def refuse_occupied(directory: Path, overwrite: bool, hint: str) -> None:
    """:class:`ExportExistsError` (its message ending in ``hint``) unless ``directory`` may take an
    export: absent, empty, or with ``overwrite`` an earlier export (:func:`is_export`).
    Overwriting replaces an export only: a file, or a directory of other files (a mistyped path,
    the repository, a model directory), is never removed for one."""
    if not directory.exists() or (directory.is_dir() and not any(directory.iterdir())):
        return
    if not overwrite:
        raise ExportExistsError(f"{directory} already exists and is not empty; {hint}")
    if not is_export(directory):
        raise ExportExistsError(f"{directory} is not a fingerprinter export (no {CONFIG_NAME} with "
                                "'format_version' and 'isq_config') and overwriting replaces only an "
                                "export; choose another directory")


def is_export(directory: Path) -> bool:
    """Whether ``directory`` holds a fingerprinter export: a ``config.json`` that is a JSON object
    with ``format_version`` and ``isq_config`` (a Hugging Face model directory has a
    ``config.json`` too, and is no export)."""
    try:
        meta = json.loads((directory / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(meta, dict) and "format_version" in meta and "isq_config" in meta


def write_directory(directory: Path, tensors: Mapping[str, Tensor], meta: dict[str, Any],
                    write_tokenizer: Callable[[Path], Any], run_record: Mapping[str, Any] | None,
                    overwrite: bool = False) -> Path:
    """Write weights, tokenizer, run record and ``config.json`` into a temporary sibling
    directory, then move it into place, so ``directory`` is always a complete export or absent.
    An existing, non-empty ``directory`` raises :class:`ExportExistsError` unless ``overwrite`` and
    it is an earlier export (:func:`refuse_occupied`)."""
    # resolved: "." has no name to stage beside, and an overwrite through a symbolic link replaces
    # the export it points to, not the link
    given, directory = Path(directory), Path(os.path.realpath(directory))
    refuse_occupied(given, overwrite, "choose another directory or overwrite it explicitly")
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise NonFiniteWeights(f"tensor {name} holds NaN or infinite values (the training diverged): "
                                   f"nothing exported to {given}")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        # written by this process, not safetensors' save_file: that renames a private temporary file
        # into place (mode 0600), which another account serving the export could not read
        weights = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
        (staging / WEIGHTS_NAME).write_bytes(save(weights, metadata={"format": "pt"}))
        write_tokenizer(staging)
        if run_record is not None:
            (staging / RUN_RECORD_NAME).write_text(json.dumps(run_record, indent=2, default=str))
        files = sorted(p.name for p in staging.iterdir() if p.name != RUN_RECORD_NAME)
        meta = {"format_version": FORMAT_VERSION, **meta,
                "files": {name: sha256_file(staging / name) for name in files}}
        meta[CONFIG_KEY] = config_checksum(meta)
        (staging / CONFIG_NAME).write_text(json.dumps(meta, indent=2, default=str))
        if not overwrite:  # a rename fails onto a non-empty directory: nothing written meanwhile is lost
            try:
                staging.rename(directory)
            except OSError:
                raise ExportExistsError(f"{given} was written by another export meanwhile; choose "
                                        "another directory or overwrite it explicitly") from None
            return given
        retired = directory.parent / f".{directory.name}.old-{os.getpid()}"
        if directory.exists():
            directory.rename(retired)
        staging.rename(directory)
        shutil.rmtree(retired, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return given


def listed_files(meta: Mapping[str, Any]) -> list[str]:
    """The files an export is made of: those its ``files`` field lists (a format-1 export: the
    weights and :data:`TOKENIZER_NAMES`). Anything else in its directory is not part of it."""
    return [WEIGHTS_NAME, *TOKENIZER_NAMES] if meta["format_version"] == 1 else list(meta.get("files") or {})


def read_meta(directory: Path) -> dict[str, Any]:
    """``config.json``, checked: readable JSON, a supported format, the required fields typed,
    and (format 2) every recorded file present with its checksum."""
    path = directory / CONFIG_NAME
    if not directory.is_dir():
        raise FingerprinterLoadError(f"{directory}: fingerprinter directory not found")
    if not path.is_file():
        raise FingerprinterLoadError(f"{directory} is not a fingerprinter directory: "
                                     f"{CONFIG_NAME} is missing")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FingerprinterLoadError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(meta, dict):
        raise FingerprinterLoadError(f"{path}: expected a JSON object")
    if meta.get("format_version") not in READABLE_VERSIONS:
        raise FingerprinterLoadError(f"{path}: field 'format_version': unsupported value "
                                     f"{meta.get('format_version')!r} (readable: {READABLE_VERSIONS})")
    for name, kind in META_FIELDS.items():
        if not isinstance(meta.get(name), kind):
            raise FingerprinterLoadError(f"{path}: field {name!r} is missing or not a {kind.__name__}")
    if meta["format_version"] >= 3 and meta.get(CONFIG_KEY) != config_checksum(meta):
        raise FingerprinterLoadError(f"{path}: its fields differ from those field {CONFIG_KEY!r} was "
                                     "computed from (or it has none): the file was changed after export")
    files = meta.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(value, str) for value in files.values()):
        raise FingerprinterLoadError(f"{path}: field 'files' must map each file name to its SHA-256")
    for name in files:
        if name in ("", ".", "..") or Path(name).name != name:
            # Loading copies each listed file by its name: one naming a path would be read, and
            # written, outside both the export and the copy.
            raise FingerprinterLoadError(f"{path}: field 'files' lists {name!r}, which is not the "
                                         "name of a file in the fingerprinter directory")
    required = listed_files(meta)
    if meta["format_version"] >= 2 and WEIGHTS_NAME not in required:
        raise FingerprinterLoadError(f"{path}: field 'files' does not list {WEIGHTS_NAME}")
    for name in required:
        if not (directory / name).is_file():
            raise FingerprinterLoadError(f"{directory / name} is missing (listed in {path.name})")
    for name, expected in files.items():
        if sha256_file(directory / name) != expected:
            raise FingerprinterLoadError(f"{directory / name}: SHA-256 differs from field 'files.{name}' of "
                                         f"{path.name}: the file was changed or truncated after export")
    return meta


def check_codebook_shape(directory: Path, shape: tuple[int, int]) -> None:
    """The codebook ``model.safetensors`` holds has ``shape`` (``config.json``'s number and size of
    codes), read from the file's header alone: checked before the model is built, so a config that
    claims more codes than the file holds is refused before it allocates them."""
    path = directory / WEIGHTS_NAME
    try:
        with safe_open(str(path), "pt") as weights:
            names = {LEGACY_KEYS.get(key, key): key for key in weights.keys()}  # noqa: SIM118
            stored = names.get(CODEBOOK_KEY)
            found = None if stored is None else tuple(weights.get_slice(stored).get_shape())
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise FingerprinterLoadError(f"{path}: not a readable safetensors file ({err})") from None
    if found is None:
        raise FingerprinterLoadError(f"{path}: missing tensor(s) {CODEBOOK_KEY}")
    if found != shape:
        raise FingerprinterLoadError(f"{path}: tensor {CODEBOOK_KEY} has shape {found}, but {CONFIG_NAME} "
                                     f"gives num_codes and code_dim {shape}")


def read_tensors(directory: Path, expected: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``model.safetensors``: exactly the ``expected`` names, each of its shape and finite."""
    path = directory / WEIGHTS_NAME
    try:
        saved = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise FingerprinterLoadError(f"{path}: not a readable safetensors file ({err})") from None
    saved = {LEGACY_KEYS.get(key, key): value for key, value in saved.items()}
    missing = sorted(set(expected) - set(saved))
    if missing:
        raise FingerprinterLoadError(f"{path}: missing tensor(s) {', '.join(missing[:5])}"
                                     + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    unexpected = sorted(set(saved) - set(expected))
    if unexpected:
        raise FingerprinterLoadError(f"{path}: unexpected tensor(s) {', '.join(unexpected[:5])}")
    for key, tensor in expected.items():
        if tuple(saved[key].shape) != tuple(tensor.shape):
            raise FingerprinterLoadError(
                f"{path}: tensor {key} has shape {tuple(saved[key].shape)}, expected {tuple(tensor.shape)}")
        if saved[key].is_floating_point() and not bool(torch.isfinite(saved[key]).all()):
            raise FingerprinterLoadError(f"{path}: tensor {key} holds NaN or infinite values")
    return saved


def check_identity(directory: Path, recorded: Mapping[str, Any], loaded: Mapping[str, Any]) -> None:
    """The loaded fingerprinter must be the one ``config.json`` recorded: its codebook, and (where
    recorded: exports made before the field have none) its encoder part, which ``config.json``'s
    own ``isq_config`` (maximum length, projection normalisation) changes and no file checksum
    covers."""
    for key in (*IDENTITY_KEYS, ENCODER_KEY):
        if key == ENCODER_KEY and key not in recorded:
            continue
        if recorded.get(key) != loaded[key]:
            made = f"the codebook in {WEIGHTS_NAME} gives" if key in IDENTITY_KEYS else \
                f"the encoder, tokenizer and field 'isq_config' of {CONFIG_NAME} give"
            raise FingerprinterLoadError(
                f"{directory / CONFIG_NAME}: field 'identity.{key}' is {recorded.get(key)!r}, "
                f"but {made} {loaded[key]!r}: the export was changed after it was written")


def read_run_record(directory: Path) -> dict[str, Any] | None:
    path = directory / RUN_RECORD_NAME
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FingerprinterLoadError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(record, dict):
        raise FingerprinterLoadError(f"{path}: expected a JSON object")
    return record
