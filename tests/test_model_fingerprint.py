"""ISQModel, projection and the exported fingerprinter (docs/design.md §1 and §2)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from isq.codes import collapse_repeats
from isq.config import ISQConfig
from isq.encoder import MINILM_ALIAS
from isq.export import sha256_file
from isq.fingerprint import Fingerprinter
from isq.model import ISQModel, info_nce
from isq.projection import StrideOneProjection
from isq.ranges import OutOfRange
from tests.conftest import tiny_config, write_config


def assign(model: ISQModel, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The training quantizer's nearest codes (B, L), -1 at padding: what a fingerprint must equal."""
    indices = model.quantizer.codebook.nearest(z.reshape(-1, z.shape[-1])).indices.reshape(z.shape[:-1])
    return indices if mask is None else indices.masked_fill(~mask.bool(), -1)


@pytest.mark.parametrize("length", [1, 2, 7, 64])
def test_projection_keeps_length(length):
    proj = StrideOneProjection(12, 5)
    assert proj(torch.randn(3, length, 12)).shape == (3, length, 5)


def test_projection_ignores_padding_content():
    proj = StrideOneProjection(6, 4)
    hidden = torch.randn(1, 5, 6)
    mask = torch.tensor([[1, 1, 1, 0, 0]], dtype=torch.bool)
    other = hidden.clone()
    other[0, 3:] = 99.0
    torch.testing.assert_close(proj(hidden, mask)[mask], proj(other, mask)[mask])


def test_even_kernel_refused():
    with pytest.raises(ValueError, match="odd"):
        StrideOneProjection(4, 4, kernel_size=2)


def _batch(model: ISQModel):
    tok = model.tokenizer
    ctx = tok(["A: how much is the red one?", "B: see you at 7 pm then"], padding=True, return_tensors="pt")
    tgt = tok(["It costs 20 dollars.", "Great, bye!"], padding=True, return_tensors="pt")
    return ctx.input_ids, ctx.attention_mask, tgt.input_ids.masked_fill(tgt.attention_mask == 0, -100)


def test_loss_is_the_sum_of_its_components_and_gradients_reach_the_encoder(tiny):
    torch.manual_seed(0)
    model = ISQModel(tiny).train()
    out = model(*_batch(model))
    expected = out.ce_loss + tiny.lambda_vq * (out.codebook_loss + tiny.beta * out.commitment_loss) \
        + tiny.lambda_ent * out.entropy_loss
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    groups = model.parameter_groups()
    assert groups["encoder"] and groups["head"]
    enc_grad = sum(p.grad.abs().sum() for p in groups["encoder"] if p.grad is not None)
    assert enc_grad > 0, "no gradient reached the encoder through the straight-through estimator"
    assert model.semantic_encoder.projection.conv.weight.grad.abs().sum() > 0


def test_reconstruction_term_is_off_by_default_and_adds_token_ce_when_on(tiny):
    torch.manual_seed(0)
    off = ISQModel(tiny).train()
    assert off.token_head is None and off(*_batch(off)).reconstruction_loss.item() == 0.0
    torch.manual_seed(0)
    model = ISQModel(tiny_config(lambda_rec=0.5)).eval()  # eval: no EMA step moves the codebook mid-check
    input_ids, attention_mask, labels = _batch(model)
    out = model(input_ids, attention_mask, labels)
    expected = out.ce_loss + tiny.lambda_vq * (out.codebook_loss + tiny.beta * out.commitment_loss) \
        + tiny.lambda_ent * out.entropy_loss + 0.5 * out.reconstruction_loss
    torch.testing.assert_close(out.loss, expected)
    # The term is the CE of each real input token given its own quantized code.
    mask = attention_mask.bool()
    codes = model.quantizer.codebook.vectors[out.indices[mask]]
    reference = torch.nn.functional.cross_entropy(model.token_head(codes), input_ids[mask])
    torch.testing.assert_close(out.reconstruction_loss, reference, atol=1e-5, rtol=1e-5)
    # ...and it reaches the projection through the straight-through estimator.
    out.reconstruction_loss.backward()
    assert model.semantic_encoder.projection.conv.weight.grad.abs().sum() > 0


def test_info_nce_is_zero_for_matched_one_hot_pairs_and_log_b_when_nothing_differs():
    one_hot = torch.eye(4)
    assert info_nce(one_hot, one_hot, temperature=0.01).item() < 1e-6
    uniform = torch.ones(4, 8)
    torch.testing.assert_close(info_nce(uniform, uniform, temperature=0.1), torch.tensor(math.log(4)))
    # Swapping the positives of two rows makes those two rows wrong.
    swapped = one_hot[[1, 0, 2, 3]]
    assert info_nce(one_hot, swapped, temperature=0.01).item() > 10


def test_contrastive_term_compares_context_codes_with_next_turn_codes(tiny):
    torch.manual_seed(0)
    off = ISQModel(tiny).train()
    assert off(*_batch(off)).contrastive_loss.item() == 0.0
    torch.manual_seed(0)
    model = ISQModel(tiny_config(lambda_nce=0.5)).eval()
    input_ids, attention_mask, labels = _batch(model)
    out = model(input_ids, attention_mask, labels)
    expected = out.ce_loss + tiny.lambda_vq * (out.codebook_loss + tiny.beta * out.commitment_loss) \
        + tiny.lambda_ent * out.entropy_loss + 0.5 * out.contrastive_loss
    torch.testing.assert_close(out.loss, expected)
    # The next turn is encoded like a context: its real tokens only, padding left out.
    next_mask = labels >= 0
    next_ids = labels.masked_fill(~next_mask, model.tokenizer.pad_token_id)
    with torch.no_grad():
        z = model.semantic_encoder(input_ids, attention_mask)
        z_next = model.semantic_encoder(next_ids, next_mask.long())
        bags = (model.quantizer.code_distribution(z, attention_mask),
                model.quantizer.code_distribution(z_next, next_mask))
    torch.testing.assert_close(out.contrastive_loss, info_nce(*bags, tiny.nce_temperature))
    out.contrastive_loss.backward()
    assert model.semantic_encoder.projection.conv.weight.grad.abs().sum() > 0


def test_the_next_turns_pass_leaves_the_token_norms_running_statistics_to_the_contexts():
    """With token standardisation, a training step moves the running statistics once, by the
    contexts' tokens, whether or not the contrastive term encodes the next turns as well."""
    stats = []
    for lambda_nce in (0.0, 0.5):
        torch.manual_seed(0)
        model = ISQModel(tiny_config(normalize_projection="token", lambda_nce=lambda_nce)).train()
        model(*_batch(model))
        norm = model.semantic_encoder.projection.norm
        stats.append((norm.running_mean.clone(), norm.running_var.clone()))
    assert not torch.equal(stats[0][0], torch.zeros_like(stats[0][0]))  # the contexts moved them
    torch.testing.assert_close(stats[0], stats[1], rtol=0, atol=0)


def test_frozen_encoder_gets_no_gradient_and_stays_in_eval(tiny):
    model = ISQModel(tiny_config(freeze_encoder=True)).train()
    assert not model.encoder.training
    model(*_batch(model)).loss.backward()
    assert model.parameter_groups()["encoder"] == []
    assert all(p.grad is None for p in model.encoder.parameters())


def test_unknown_config_field_is_named():
    with pytest.raises(ValueError, match="code_dimm"):
        ISQConfig.from_dict({"code_dimm": 3})


@pytest.mark.parametrize(("overrides", "named"), [
    ({"num_codes": 2.5}, "'num_codes' must be int, got 2.5"),
    ({"freeze_encoder": "false"}, "'freeze_encoder' must be bool"),
    ({"decoder": None}, "'decoder' must be dict"),
    ({"decoder": {"d_model": 32, "num_decoder_layer": 7}}, "'decoder.num_decoder_layer' is not a T5 setting"),
    ({"encoder_config": {"d_model": 8}}, "'encoder_config' needs a 'model_type'"),
    ({"ema_decay": 0.0}, "'ema_decay' is 0.0"),
])
def test_a_mistyped_or_misspelt_setting_is_refused_naming_it(overrides, named):
    """Python construction is checked as YAML and exports are: nothing is silently ignored."""
    with pytest.raises(OutOfRange, match=named):
        tiny_config(**overrides)


@pytest.mark.parametrize(("overrides", "named"), [
    ({"lora_rank": 2, "lora_targets": ["qq"]}, "'lora_targets' is \\['qq'\\]: Target modules"),
    ({"decoder": {"d_model": 32, "dropout_rate": 5.0}}, "'decoder' builds no decoder: dropout probability"),
    ({"decoder": {"d_model": 2.5}}, "'decoder' builds no decoder: .*'d_model' expected int"),
    ({"decoder": {"feed_forward_proj": "bogus"}}, "'decoder' builds no decoder: unknown value 'bogus'"),
    ({"encoder_config": {"model_type": "t5", "d_model": 2.5}},
     "'encoder_config' builds no encoder: .*d_model"),
    ({"encoder_config": {"model_type": "t5", "vocab_size": 1000, "d_model": 32, "num_layers": 1,
                         "num_heads": 2, "d_kv": 16}},
     "'encoder_config': the encoder embeds 1000 token ids, but the tokenizer"),
])
def test_a_setting_the_encoder_cannot_take_is_refused_naming_it(overrides, named):
    with pytest.raises(OutOfRange, match=named):
        ISQModel(tiny_config(**overrides))


def test_a_max_length_past_the_encoders_positions_is_refused():
    with pytest.raises(OutOfRange, match="'max_length' is 1024: this encoder takes at most 512 tokens"):
        ISQModel(tiny_config(encoder=MINILM_ALIAS, encoder_config=None, freeze_encoder=True, max_length=1024))


def test_collapse_repeats():
    assert collapse_repeats([3, 3, 1, 1, 3, 2, 2]) == (3, 1, 3, 2)
    assert collapse_repeats([]) == ()


@pytest.fixture
def exported(tiny, tmp_path):
    torch.manual_seed(0)
    model = ISQModel(tiny).train()
    for _ in range(2):  # move the codebook away from its initial state
        model(*_batch(model))
    path = model.export_fingerprinter(tmp_path / "fp", run_record={"steps": 2})
    return model, path


TEXTS = ["Let's meet at 7:45 tomorrow.", "", "Ça coûte 20 € — 日本へ行きます 🙂", "word " * 400, "Hi"]


def test_export_load_gives_bit_identical_codes(exported):
    model, path = exported
    loaded = Fingerprinter.from_pretrained(path)
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())
    model.eval()
    tok = model.tokenizer(TEXTS, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        z = model.semantic_encoder(tok.input_ids, tok.attention_mask)
        direct = assign(model, z, tok.attention_mask)
    assert torch.equal(loaded.token_codes(tok.input_ids, tok.attention_mask), direct)
    prints = loaded.fingerprint(TEXTS)
    assert [p.token_codes for p in prints] == [tuple(int(c) for c in row if c >= 0) for row in direct]
    assert loaded.run_record == {"steps": 2}
    assert json.loads((path / "config.json").read_text())["identity"] == loaded.identity


def test_fingerprints_of_edge_case_texts(exported):
    _, path = exported
    fp = Fingerprinter.from_pretrained(path)
    empty, long = fp.fingerprint([TEXTS[1], TEXTS[3]])
    assert len(empty.token_codes) == 2  # [CLS] [SEP] only
    assert len(long.token_codes) == 64  # truncated at config.max_length
    non_ascii = fp.fingerprint([TEXTS[2]])[0]
    assert non_ascii.codes == set(non_ascii.token_codes) and len(non_ascii.sequence) >= 1
    # Batch composition does not change a text's fingerprint.
    assert fp.fingerprint(TEXTS)[0] == fp.fingerprint([TEXTS[0]])[0]
    with pytest.raises(TypeError):
        fp.fingerprint("not a list")


def rewrite_weights(path, tensors) -> None:
    """Replace the weights and record their new checksum, as a consistent but wrong export would."""
    save_file(tensors, str(path / "model.safetensors"))
    meta = json.loads((path / "config.json").read_text())
    meta["files"]["model.safetensors"] = sha256_file(path / "model.safetensors")
    write_config(path, meta)


def test_missing_tensor_is_named(exported, tmp_path):
    _, path = exported
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["codebook.vectors"]
    rewrite_weights(path, tensors)
    with pytest.raises(ValueError, match="missing tensor.*codebook"):
        Fingerprinter.from_pretrained(path)


def test_misshaped_tensor_is_named(exported):
    _, path = exported
    tensors = load_file(str(path / "model.safetensors"))
    tensors["semantic_encoder.projection.conv.weight"] = torch.zeros(3, 3, 3)
    rewrite_weights(path, tensors)
    with pytest.raises(ValueError, match=r"projection\.conv\.weight has shape \(3, 3, 3\)"):
        Fingerprinter.from_pretrained(path)


def test_not_a_fingerprinter_directory(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        Fingerprinter.from_pretrained(tmp_path)


@pytest.fixture(scope="module")
def minilm_export(tmp_path_factory):
    config = ISQConfig(encoder=MINILM_ALIAS, freeze_encoder=True, code_dim=16, num_codes=32, max_length=32,
                       decoder=dict(d_model=32, d_ff=64, num_decoder_layers=1, num_heads=2, d_kv=16))
    model = ISQModel(config)
    return model, model.export_fingerprinter(tmp_path_factory.mktemp("minilm") / "fp")


def test_frozen_pretrained_encoder_is_referenced_not_copied(minilm_export):
    model, path = minilm_export
    meta = json.loads((path / "config.json").read_text())
    assert meta["encoder_reference"]["encoder"] == MINILM_ALIAS
    assert len(meta["encoder_reference"]["sha256"]) == 64
    assert not any(k.startswith("semantic_encoder.encoder.")
                   for k in load_file(str(path / "model.safetensors")))
    assert (path / "model.safetensors").stat().st_size < 100_000
    loaded = Fingerprinter.from_pretrained(path)
    tok = model.tokenizer(["my sister lives in Paris"], return_tensors="pt")
    with torch.no_grad():
        z = model.semantic_encoder(tok.input_ids, tok.attention_mask)
    assert loaded.fingerprint(["my sister lives in Paris"])[0].token_codes == tuple(
        assign(model, z)[0].tolist())


def test_encoder_checksum_mismatch_is_refused(minilm_export):
    _, path = minilm_export
    meta = json.loads((path / "config.json").read_text())
    meta["encoder_reference"]["sha256"] = "0" * 64
    write_config(path, meta)
    with pytest.raises(ValueError, match="SHA-256"):
        Fingerprinter.from_pretrained(path)


def test_token_norm_standardises_real_tokens_only():
    from isq.projection import MaskedTokenNorm

    norm = MaskedTokenNorm(3).train()
    z = torch.randn(2, 4, 3) * 5 + 2
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    z[~mask] = 1e4  # padding must not enter the statistics
    out = norm(z, mask)[mask]
    torch.testing.assert_close(out.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(0, unbiased=False), torch.ones(3), atol=1e-4, rtol=0)
    real = z[mask]
    torch.testing.assert_close(norm.running_mean, 0.01 * real.mean(0))
    norm.eval()
    expected = (z - norm.running_mean) / torch.sqrt(norm.running_var + norm.eps)
    torch.testing.assert_close(norm(z, mask), expected)


@pytest.mark.parametrize("normalize", ["token", "layer"])
def test_normalised_projection_exports_identically(normalize, tmp_path):
    torch.manual_seed(0)
    model = ISQModel(tiny_config(normalize_projection=normalize)).train()
    for _ in range(2):
        model(*_batch(model))
    loaded = Fingerprinter.from_pretrained(model.export_fingerprinter(tmp_path / "fp"))
    model.eval()
    tok = model.tokenizer(TEXTS, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        direct = assign(model, model.semantic_encoder(tok.input_ids, tok.attention_mask), tok.attention_mask)
    assert torch.equal(loaded.token_codes(tok.input_ids, tok.attention_mask), direct)
    if normalize == "layer":
        z = loaded.semantic_encoder(tok.input_ids, tok.attention_mask)
        torch.testing.assert_close(z.mean(-1), torch.zeros(z.shape[:2]), atol=1e-5, rtol=0)


def test_unknown_projection_normalisation_refused():
    with pytest.raises(ValueError, match="normalize_projection must be one of none, token, layer"):
        StrideOneProjection(4, 4, normalize_projection="batch")
