"""Encoder fine-tuning through low-rank adapters: only adapters train, step 0 equals the base
encoder, and an export holds the adapters beside a checksum reference to the installed encoder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from isq.config import ISQConfig
from isq.encoder import MINILM_ALIAS
from isq.fingerprint import Fingerprinter
from isq.model import ISQModel
from training.module import trainable_summary

TEXTS = ["Caroline went to the LGBTQ support group on 7 May 2023.", "Melanie painted a lake at sunrise."]


def minilm(**overrides) -> ISQConfig:
    values = dict(encoder=MINILM_ALIAS, freeze_encoder=True, code_dim=16, num_codes=32, max_length=32,
                  decoder=dict(d_model=32, d_ff=64, num_decoder_layers=1, num_heads=2, d_kv=16))
    return ISQConfig(**(values | overrides))


@pytest.fixture(scope="module")
def pair() -> tuple[ISQModel, ISQModel]:
    torch.manual_seed(0)
    plain = ISQModel(minilm())
    adapted = ISQModel(minilm(lora_rank=4))
    adapted.warm_start(plain.fingerprinter())
    return plain, adapted


def test_only_adapters_of_the_encoder_train(pair) -> None:
    _, adapted = pair
    encoder = {n for n, p in adapted.semantic_encoder.encoder.named_parameters() if p.requires_grad}
    assert encoder and all(".lora_" in n for n in encoder)
    assert len(encoder) == 6 * 2 * 2  # 6 layers x (query, value) x (A, B)
    groups = adapted.parameter_groups()
    assert {id(p) for p in groups["encoder"]} == {id(p)
                                                  for n,
                                                  p in adapted.semantic_encoder.encoder.named_parameters()
                                                  if ".lora_" in n}


def test_step_zero_codes_equal_the_base_encoders(pair) -> None:
    plain, adapted = pair
    assert adapted.fingerprinter().fingerprint(TEXTS) == plain.fingerprinter().fingerprint(TEXTS)


def test_gradients_reach_the_adapters_through_the_frozen_encoder(pair) -> None:
    _, adapted = pair
    batch = adapted.tokenizer(TEXTS, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    adapted.train()
    adapted.zero_grad()
    adapted(batch["input_ids"], batch["attention_mask"], labels).loss.backward()
    grads = {n: p.grad for n, p in adapted.semantic_encoder.encoder.named_parameters() if ".lora_B" in n}
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads.values())
    adapted.eval()


def test_an_adapted_export_is_small_and_loads_to_the_same_codes(pair, tmp_path) -> None:
    plain, adapted = pair
    with torch.no_grad():  # move the adapters so the check is not trivially the base encoder
        for name, parameter in adapted.semantic_encoder.encoder.named_parameters():
            if ".lora_B" in name:
                parameter.normal_(std=0.05)
    path = adapted.export_fingerprinter(tmp_path / "fp")
    stored = load_file(str(path / "model.safetensors"))
    encoder_keys = [k for k in stored if k.startswith("semantic_encoder.encoder.")]
    assert encoder_keys and all(".lora_" in k for k in encoder_keys)
    assert (path / "model.safetensors").stat().st_size < 1_000_000
    loaded = Fingerprinter.from_pretrained(path)
    assert loaded.fingerprint(TEXTS) == adapted.fingerprinter().fingerprint(TEXTS)
    assert loaded.fingerprint(TEXTS) != plain.fingerprinter().fingerprint(TEXTS)  # the adapters are used


def test_the_trainable_line_says_only_adapters_train(pair) -> None:
    plain, adapted = pair
    total = sum(p.numel() for p in adapted.encoder.parameters())
    assert trainable_summary(plain).startswith("trainable parameters: encoder 0 of 22.6 M;")
    adapters = sum(p.numel() for n, p in adapted.named_parameters() if ".lora_" in n)
    assert 0 < adapters < total / 100
    expected = f"encoder {adapters / 1e3:.1f} k of {total / 1e6:.1f} M (LoRA adapters only)"
    assert expected in trainable_summary(adapted)


def test_loading_an_encoder_draws_no_progress_bar(capfd) -> None:
    ISQModel(minilm())
    assert "Loading weights" not in capfd.readouterr().err


@pytest.mark.parametrize("loader", ["AutoModel", "BertModel", "AutoTokenizer", "AutoConfig"])
def test_a_model_in_the_hugging_face_cache_loads_asking_the_hub_for_nothing(loader, tmp_path, monkeypatch):
    """A hub name found in the cache loads from it with no request to the hub: an ``AutoModel``
    asked the hub for an ``adapter_config.json`` even when told to stay local (with the hub
    unreachable, 23 s of the hub client's retries)."""
    import huggingface_hub.constants
    import huggingface_hub.file_download
    import transformers

    from isq.encoder import from_pretrained, resolve_encoder_path

    snapshot = tmp_path / "models--org--tiny" / "snapshots" / ("0" * 40)
    transformers.BertModel(transformers.BertConfig(
        vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
    )).save_pretrained(snapshot)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (snapshot / name).write_bytes((Path(resolve_encoder_path(MINILM_ALIAS)) / name).read_bytes())
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("0" * 40)
    asked: list[str] = []

    def hub(url, *args, **kwargs):
        asked.append(url)
        raise OSError("the hub cannot be reached")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # as a user's: the tests set it
    monkeypatch.setattr(huggingface_hub.file_download, "get_hf_file_metadata", hub)
    loaded = from_pretrained(getattr(transformers, loader), "org/tiny", cache_dir=str(tmp_path))
    assert asked == []
    assert type(loaded).__name__ == {"AutoModel": "BertModel", "BertModel": "BertModel",
                                     "AutoTokenizer": "BertTokenizer", "AutoConfig": "BertConfig"}[loader]


def test_loading_the_sentence_embedder_draws_no_progress_bar(capfd) -> None:
    from retrieval.index.embed import SentenceEmbedder

    assert SentenceEmbedder().dim == 384
    assert "Loading weights" not in capfd.readouterr().err


def test_a_frozen_encoder_warm_started_with_trained_weights_is_saved_not_referenced(tmp_path) -> None:
    """The reference stands for the installed weights: a frozen model that took a trained encoder
    from its source must save it, or its reload fingerprints with the installed one."""
    torch.manual_seed(0)
    trained = ISQModel(minilm(freeze_encoder=False))
    with torch.no_grad():
        for parameter in trained.encoder.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    frozen = ISQModel(minilm())
    frozen.warm_start(trained.fingerprinter())
    path = frozen.export_fingerprinter(tmp_path / "fp")
    assert not frozen.fingerprinter().references_encoder()
    reloaded = Fingerprinter.from_pretrained(path)
    assert reloaded.fingerprint(TEXTS) == trained.fingerprinter().fingerprint(TEXTS)
    assert ISQModel(minilm()).fingerprinter().references_encoder()  # the installed weights: referenced
