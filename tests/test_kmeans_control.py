"""The k-means control codebook: identity projection, nearest-centroid codes, a loadable directory."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from isq.fingerprint import Fingerprinter
from isq.synthetic import synthetic_dialogues, write_synthetic_corpus
from tests.conftest import tiny_config
from training.kmeans_control import build_kmeans_fingerprinter, main, sample_texts, token_states


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [turn for dialogue in synthetic_dialogues(40, seed=3) for turn in dialogue]


@pytest.fixture(scope="module")
def control(texts):
    torch.manual_seed(0)
    return build_kmeans_fingerprinter(tiny_config(num_codes=8), texts, max_tokens=500, seed=0, niter=5)


def hidden_states(fingerprinter: Fingerprinter,
                  texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch = fingerprinter.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        h = fingerprinter.semantic_encoder.encoder(**batch).last_hidden_state
        z = fingerprinter.semantic_encoder(batch["input_ids"], batch["attention_mask"])
    return h, z, batch["attention_mask"].bool()


def test_identity_projection_reproduces_the_encoder_states(control, texts):
    fingerprinter, _ = control
    config = fingerprinter.config
    assert config.freeze_encoder and config.code_dim == 32 and config.kernel_size == 3
    assert fingerprinter.codebook.vectors.shape == (8, 32)
    h, z, mask = hidden_states(fingerprinter, texts[:6])
    torch.testing.assert_close(z[mask], h[mask], atol=1e-5, rtol=0)


def test_codes_are_the_nearest_centroids(control, texts):
    fingerprinter, _ = control
    sample = texts[:6]
    h, _, mask = hidden_states(fingerprinter, sample)
    codebook = fingerprinter.codebook.vectors.double().numpy()
    prints = fingerprinter.fingerprint(sample)
    for row, fp in enumerate(prints):
        states = h[row][mask[row]].double().numpy()
        distances = ((states[:, None, :] - codebook[None, :, :]) ** 2).sum(-1)
        assert fp.token_codes == tuple(int(c) for c in distances.argmin(1))


def test_record_counts_the_clustered_tokens(control, texts):
    _, record = control
    assert record["kind"] == "kmeans_control" and record["tokens"] == 500
    assert record["texts_available"] == len(texts) and 0 < record["texts_used"] < len(texts)
    assert 1 <= record["codes_used"] <= 8 and record["kmeans"]["seed"] == 0


def test_every_clustered_state_counts_not_a_sample_of_them(texts):
    """1,500 states for 2 codes is more than faiss clusters by default (256 a code): each centroid
    must be the mean of all the states nearest it, as k-means over every state leaves it."""
    fingerprinter, record = build_kmeans_fingerprinter(tiny_config(num_codes=2), texts, max_tokens=1500,
                                                       seed=0, niter=40)
    tokenizer, length = fingerprinter.tokenizer, fingerprinter.config.max_length
    chosen = sample_texts(texts, tokenizer, 1500, length, 0)
    states = token_states(fingerprinter.semantic_encoder, tokenizer, chosen, length)[:1500].astype(np.float64)
    codebook = fingerprinter.codebook.vectors.double().numpy()
    nearest = ((states[:, None, :] - codebook[None, :, :]) ** 2).sum(-1).argmin(1)
    assert record["tokens"] == 1500 and set(nearest.tolist()) == {0, 1}
    for code in (0, 1):
        np.testing.assert_allclose(codebook[code], states[nearest == code].mean(0), atol=1e-4)


def test_too_few_tokens_for_the_codebook_is_an_error(texts):
    with pytest.raises(ValueError, match="cannot place 64 codes"):
        build_kmeans_fingerprinter(tiny_config(), texts[:2], max_tokens=30, niter=1)


def test_cli_writes_a_loadable_fingerprinter(tmp_path, monkeypatch):
    # The CLI builds a config from --encoder; route it to the tiny random encoder instead.
    import training.kmeans_control as module

    monkeypatch.setattr(module, "ISQConfig", lambda **kw: tiny_config(num_codes=kw["num_codes"],
                                                                        max_length=kw["max_length"]))
    root = write_synthetic_corpus(tmp_path / "corpus", sizes=(30, 2, 2))
    out = tmp_path / "control"
    assert main(["--data-root", str(root), "--num-codes", "8", "--max-tokens", "400", "--niter", "3",
                 "--max-length", "64", "--out", str(out)]) == 0
    loaded = Fingerprinter.from_pretrained(out)
    record = json.loads((out / "training_run.json").read_text())
    assert record["tokens"] == 400 and record["data"]["split"] == "train"
    assert loaded.codebook_size == 8 and loaded.config.max_length == 64
    text = ["Shall we meet at the library at 5 o'clock ?"]
    assert loaded.fingerprint(text)[0].token_codes  # one code per token
    assert np.isfinite(loaded.codebook.vectors.numpy()).all()


def test_cli_missing_data_is_a_one_line_error(tmp_path, capsys):
    assert main(["--data-root", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "dialogues_train.txt" in err and "\n" not in err


def test_projection_from_a_trained_fingerprinter_clusters_its_projected_states(texts):
    from isq.model import ISQModel

    torch.manual_seed(1)
    trained = ISQModel(tiny_config(normalize_projection="token")).eval()
    source = Fingerprinter(trained.config, trained.tokenizer, trained.semantic_encoder,
                           trained.quantizer.codebook.vectors)
    fingerprinter, record = build_kmeans_fingerprinter(tiny_config(num_codes=8), texts, max_tokens=500,
                                                       seed=0, niter=5, projection_from=source)
    assert record["projection"] == "trained" and fingerprinter.config.normalize_projection == "token"
    assert fingerprinter.codebook.vectors.shape == (8, 16)
    sample = texts[:5]
    batch = source.tokenizer(sample, padding=True, return_tensors="pt")
    with torch.inference_mode():
        z = source.semantic_encoder(batch["input_ids"], batch["attention_mask"])
    mask = batch["attention_mask"].bool()
    codebook = fingerprinter.codebook.vectors.double().numpy()
    for row, fp in enumerate(fingerprinter.fingerprint(sample)):
        states = z[row][mask[row]].double().numpy()
        assert fp.token_codes == tuple(int(c)
                                       for c in ((states[:, None] - codebook[None]) ** 2).sum(-1).argmin(1))


def test_cli_names_a_bad_projection_directory(tmp_path, capsys):
    root = write_synthetic_corpus(tmp_path / "corpus", sizes=(5, 2, 2))
    assert main(["--data-root", str(root), "--projection-from", str(tmp_path / "absent"),
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--projection-from" in err and "absent" in err
    assert not (tmp_path / "out").exists()


def test_warm_start_from_the_control_fingerprints_exactly_like_it(texts):
    from isq.model import ISQModel

    torch.manual_seed(0)
    source, _ = build_kmeans_fingerprinter(tiny_config(num_codes=8, kernel_size=1), texts, max_tokens=500,
                                           niter=5)
    model = ISQModel(tiny_config(num_codes=8, code_dim=32, kernel_size=1))  # encoder width 32
    model.warm_start(source)
    assert bool(model.quantizer.initialized)
    started = Fingerprinter(model.config, model.tokenizer, model.semantic_encoder,
                            model.quantizer.codebook.vectors)
    assert started.identity == source.identity
    assert [fp.token_codes for fp in started.fingerprint(texts[:8])] == \
        [fp.token_codes for fp in source.fingerprint(texts[:8])]


@pytest.mark.parametrize(("override", "named"), [({"kernel_size": 1}, "kernel_size"),
                                                 ({"code_dim": 16}, "code_dim"),
                                                  ({"num_codes": 16}, "num_codes")])
def test_warm_start_names_the_setting_that_differs(control, override, named):
    from isq.model import ISQModel

    settings = {"num_codes": 8, "code_dim": 32, "kernel_size": 3} | override
    with pytest.raises(ValueError, match=f"^{named} is"):
        ISQModel(tiny_config(**settings)).warm_start(control[0])


def test_warm_start_names_the_encoder_tensor_whose_shape_differs(control):
    from isq.model import ISQModel

    wider = tiny_config(num_codes=8, code_dim=32, kernel_size=3).encoder_config | {"d_ff": 128}
    model = ISQModel(tiny_config(num_codes=8, code_dim=32, kernel_size=3, encoder_config=wider))
    named = r"DenseReluDense\.wi\.weight is \(64, 32\) there but \(128, 32\) here"
    with pytest.raises(ValueError, match=named):
        model.warm_start(control[0])


def test_cli_refuses_an_even_kernel(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--data-root", str(tmp_path), "--kernel-size", "2", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "--kernel-size must be a positive odd number" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("extra", "message"), [
    (["--num-codes", "0"], "'num_codes' is 0: allowed range is >= 1"),
    (["--max-length", "2"], "'max_length' is 2: allowed range is >= 3"),
    (["--max-tokens", "0"], "--max-tokens must be at least 1, got 0"),
    (["--niter", "0"], "--niter must be at least 1, got 0"),
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--num-codes", "5000", "--max-tokens", "50"], "cannot place 5000 codes"),
    (["--seed", "2147483648"], "--seed must be from 0 to 2147483647 (faiss takes a C int), got 2147483648"),
])
def test_cli_refuses_unusable_counts_in_one_line(tmp_path, capsys, monkeypatch, extra, message):
    import training.kmeans_control as module

    monkeypatch.setattr(module, "ISQConfig", lambda **kw: tiny_config(num_codes=kw["num_codes"],
                                                                        max_length=kw["max_length"]))
    root = write_synthetic_corpus(tmp_path / "corpus", sizes=(5, 2, 2))
    try:
        code = main(["--data-root", str(root), *extra, "--out", str(tmp_path / "out")])
    except SystemExit as stopped:  # argparse's own refusal: usage line, then the error
        code = stopped.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_max_length_past_the_encoders_positions_is_refused_before_the_texts_are_encoded(tmp_path, capsys):
    """MiniLM has 512 positions: an export cut at more would be written and then refused by every
    load, so the command refuses it before it encodes anything."""
    root = write_synthetic_corpus(tmp_path / "corpus", sizes=(5, 2, 2))
    code = main(["--data-root", str(root), "--max-length", "513", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert err == "error: ISQConfig field 'max_length' is 513: this encoder takes at most 512 tokens\n"
    assert not (tmp_path / "out").exists()
