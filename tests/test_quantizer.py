"""EMAQuantizer mathematics against hand-computed values (docs/design.md §1)."""

from __future__ import annotations

import datetime
import math
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from isq.quantizer import EMAQuantizer


def two_code_quantizer(decay: float = 0.5, eps: float = 0.0, **kw) -> EMAQuantizer:
    q = EMAQuantizer(num_codes=2, code_dim=2, ema_decay=decay, ema_eps=eps, **kw)
    with torch.no_grad():
        q.codebook.load(torch.tensor([[0.0, 0.0], [10.0, 10.0]]))
    return q.train()


def test_ema_update_matches_hand_computation():
    q = two_code_quantizer()
    z = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [9.0, 10.0], [100.0, 100.0]]])
    mask = torch.tensor([[True, True, True, False]])
    out = q(z, mask)
    assert out.indices.tolist() == [[0, 0, 1, -1]]
    # counts (2, 1); sums ((1,1), (9,10)); decay 0.5 blends with size 1 / sum = code.
    torch.testing.assert_close(q.codebook.cluster_size, torch.tensor([1.5, 1.0]))
    torch.testing.assert_close(q.codebook.embed_sum, torch.tensor([[0.5, 0.5], [9.5, 10.0]]))
    torch.testing.assert_close(q.codebook.vectors, torch.tensor([[1 / 3, 1 / 3], [9.5, 10.0]]))
    torch.testing.assert_close(q.codebook.window_counts, torch.tensor([2.0, 1.0]))


def test_laplace_smoothing_of_cluster_sizes():
    q = two_code_quantizer(decay=0.5, eps=0.1)
    q(torch.tensor([[[1.0, 0.0], [0.0, 1.0], [9.0, 10.0]]]))
    size, total = torch.tensor([1.5, 1.0]), 2.5
    smoothed = (size + 0.1) / (total + 2 * 0.1) * total
    torch.testing.assert_close(q.codebook.vectors,
                               torch.tensor([[0.5, 0.5], [9.5, 10.0]]) / smoothed.unsqueeze(1))


def test_masked_positions_change_nothing():
    torch.manual_seed(0)
    z = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    garbage = z.clone()
    garbage[~mask] = 1e3 * torch.randn(int((~mask).sum()), 8)
    q1, q2 = EMAQuantizer(16, 8), EMAQuantizer(16, 8)
    q2.load_state_dict(q1.state_dict())
    o1, o2 = q1.train()(z, mask), q2.train()(garbage, mask)
    for name in ("vectors", "cluster_size", "embed_sum", "window_counts"):
        torch.testing.assert_close(getattr(q1.codebook, name), getattr(q2.codebook, name))
    torch.testing.assert_close(o1.quantized[mask], o2.quantized[mask])
    torch.testing.assert_close(o1.commitment_loss, o2.commitment_loss)
    torch.testing.assert_close(o1.entropy_loss, o2.entropy_loss)
    assert (o2.quantized[~mask] == 0).all()
    assert (o2.indices[~mask] == -1).all()
    torch.testing.assert_close(o2.revival_candidates, z[mask], rtol=0, atol=0)  # no padding revives a code


def test_eval_mode_does_not_update():
    q = two_code_quantizer().eval()
    before = q.codebook.vectors.clone()
    q(torch.randn(1, 4, 2))
    torch.testing.assert_close(q.codebook.vectors, before)
    assert q.codebook.window_counts.sum() == 0


def test_reactivation_replaces_exactly_the_dead_codes_and_survives_next_step():
    torch.manual_seed(1)
    q = EMAQuantizer(num_codes=8, code_dim=4, revive_every=2, revive_threshold=1.0).train()
    batch = torch.randn(1, 6, 4)
    candidates = q(batch).revival_candidates
    torch.testing.assert_close(candidates, batch.reshape(-1, 4), rtol=0, atol=0)
    # Force the window: codes 0-3 used twice per step on average, codes 4-7 less than once.
    q.codebook.window_counts.copy_(torch.tensor([4.0, 4.0, 2.0, 2.0, 1.0, 0.0, 0.0, 1.9]))
    before = q.codebook.vectors.clone()
    assert q.optimizer_step(candidates) == 0  # window not complete yet
    revived = q.optimizer_step(candidates)
    assert revived == 4 and int(q.dead_codes) == 4
    torch.testing.assert_close(q.codebook.vectors[:4], before[:4], rtol=1e-4, atol=1e-5)
    samples = batch.reshape(-1, 4)
    for code in range(4, 8):
        assert torch.isclose(samples,
                             q.codebook.vectors[code]).all(1).any(), f"code {code} is not a batch vector"
        assert q.codebook.cluster_size[code] == 1.0
        torch.testing.assert_close(q.codebook.embed_sum[code], q.codebook.vectors[code], rtol=1e-3, atol=1e-4)
    assert q.codebook.window_counts.sum() == 0 and int(q.codebook.window_steps) == 0
    revived_vectors = q.codebook.vectors[4:].clone()
    # The next EMA step (a batch sitting on live code 0, so nothing is assigned to the
    # revived codes) must not wipe the revived vectors out.
    q(q.codebook.vectors[0].expand(1, 3, 4).clone())
    drift = (q.codebook.vectors[4:] - revived_vectors).norm(dim=1) / revived_vectors.norm(dim=1)
    assert (drift < 0.05).all(), drift


def test_straight_through_gradient_reaches_z():
    q = EMAQuantizer(16, 4).train()
    z = torch.randn(2, 3, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    out = q(z, mask, with_entropy=False)
    (out.quantized * torch.arange(4.0)).sum().backward()
    expected = torch.arange(4.0).expand(2, 3, 4) * mask.unsqueeze(-1)
    torch.testing.assert_close(z.grad, expected)


def test_loss_components_equal_the_spec_formulas():
    torch.manual_seed(2)
    q = EMAQuantizer(8, 3, entropy_temperature=0.7).eval()
    z = torch.randn(1, 5, 3)
    out = q(z)
    zf, e = z.reshape(-1, 3).double(), q.codebook.vectors.double()
    d = ((zf[:, None, :] - e[None]) ** 2).sum(-1)
    nearest = e[d.argmin(1)]
    sq = ((zf - nearest) ** 2).sum(1).mean()
    assert math.isclose(out.commitment_loss.item(), sq.item(), rel_tol=1e-5)
    assert math.isclose(out.codebook_loss.item(), sq.item(), rel_tol=1e-5)
    p = torch.softmax(-d / 0.7, dim=1)
    h_tokens = -(p * p.log()).sum(1).mean()
    pm = p.mean(0)
    expected_ent = h_tokens - (-(pm * pm.log()).sum())
    assert math.isclose(out.entropy_loss.item(), expected_ent.item(), rel_tol=1e-4, abs_tol=1e-6)
    counts = torch.bincount(d.argmin(1), minlength=8).double()
    pc = counts[counts > 0] / counts.sum()
    assert math.isclose(out.perplexity.item(), torch.exp(-(pc * pc.log()).sum()).item(), rel_tol=1e-5)
    assert out.codes_used.item() == int((counts > 0).sum())


def test_entropy_gradient_only_when_requested():
    q = EMAQuantizer(8, 3).eval()
    z = torch.randn(1, 4, 3, requires_grad=True)
    assert q(z, with_entropy=False).entropy_loss.item() == 0.0
    q(z).entropy_loss.backward()
    assert z.grad.abs().sum() > 0


def test_bf16_autocast_keeps_codebook_and_distances_fp32():
    torch.manual_seed(3)
    q = EMAQuantizer(32, 8).train()
    z = torch.randn(2, 6, 8)
    reference = EMAQuantizer(32, 8).eval()
    reference.load_state_dict(q.state_dict())
    expected = reference(z.bfloat16().float()).indices
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = q(z.bfloat16())
    assert (q.codebook.vectors.dtype == q.codebook.embed_sum.dtype == q.codebook.cluster_size.dtype
            == torch.float32)
    assert out.commitment_loss.dtype == out.entropy_loss.dtype == out.quantized.dtype == torch.float32
    assert torch.equal(out.indices, expected)


def test_kmeans_initialisation_on_first_batch():
    torch.manual_seed(4)
    centres = torch.tensor([[5.0, 0.0], [-5.0, 0.0], [0.0, 5.0], [0.0, -5.0]])
    z = (centres.repeat_interleave(50, 0) + 0.01 * torch.randn(200, 2)).unsqueeze(0)
    q = EMAQuantizer(4, 2, kmeans_init=True, kmeans_iters=20).train()
    assert not bool(q.initialized)
    out = q(z)
    assert bool(q.initialized)
    assert out.commitment_loss.item() < 0.01 or len(torch.unique(out.indices)) < 4  # k-means local optimum
    assert int(out.codes_used) >= 3


def test_code_distribution_is_a_masked_mean_of_soft_assignments():
    q = EMAQuantizer(3, 2, entropy_temperature=0.01).train()
    q.load_codebook(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]))
    z = torch.tensor([[[1.0, 0.1], [0.9, 0.0], [0.0, 1.0], [50.0, 50.0]]], requires_grad=True)
    mask = torch.tensor([[True, True, True, False]])
    bag = q.code_distribution(z, mask)
    # At a low temperature each token is (nearly) one-hot on its nearest code; padding is left out.
    torch.testing.assert_close(bag, torch.tensor([[2 / 3, 1 / 3, 0.0]]), atol=1e-4, rtol=0)
    q.entropy_temperature = 1.0  # a saturated softmax would pass no gradient
    q.code_distribution(z, mask)[0, 1].backward()
    assert z.grad[0, :3].abs().sum() > 0 and z.grad[0, 3].abs().sum() == 0
    assert torch.equal(q.codebook.vectors, torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]))


def test_loaded_codebook_skips_kmeans_and_blends_the_first_ema_step():
    codebook = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    q = EMAQuantizer(3, 2, ema_decay=0.9, ema_eps=0.0, kmeans_init=True).train()
    q.load_codebook(codebook)
    assert bool(q.initialized) and torch.equal(q.codebook.vectors, codebook)
    q(torch.tensor([[[2.0, 0.0], [0.0, 3.0]]]))  # code 0 gets (2, 0), code 1 gets (0, 3), code 2 nothing
    # sizes 0.9 + 0.1 n, sums 0.9 e + 0.1 x; eps 0 and an unchanged total leave sum / size.
    expected = torch.tensor([[1.1, 0.0], [0.0, 1.2], [-1.0, 0.0]])
    torch.testing.assert_close(q.codebook.vectors, expected)
    with pytest.raises(ValueError, match="does not fit a codebook of 3 codes x 2 dimensions"):
        q.load_codebook(torch.zeros(4, 2))


def _ddp_worker(rank: int, world: int, init_file: str, result_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    q = EMAQuantizer(16, 4, revive_every=2).train()  # same seed: same initial codebook
    torch.manual_seed(100 + rank)  # different data and different random draws per rank
    for _ in range(4):
        q.optimizer_step(q(torch.randn(1, 8, 4) + rank).revival_candidates)
    torch.save({k: v for k, v in q.state_dict().items()}, os.path.join(result_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _revival_worker(rank: int, world: int, init_file: str, result_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))  # a rank left waiting fails, not hangs
    torch.manual_seed(0)
    codebook = EMAQuantizer(8, 4).codebook
    dead = torch.tensor([True, False, True, False, False, False, False, False])
    candidates = torch.randn(5, 4) if rank == 0 else torch.zeros(0, 4)  # rank 1's last batch: no tokens
    revived = codebook.revive(dead, candidates)
    torch.save({"revived": revived, "vectors": codebook.vectors}, os.path.join(result_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_a_rank_without_candidates_revives_with_rank_zeros_draw():
    """Rank 0 draws the dead codes' new vectors and broadcasts them: a rank whose own batch gave no
    candidates must take part (it returned early, and rank 0 waited in the broadcast for ever)."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_revival_worker, args=(2, os.path.join(tmp, "init"), tmp), nprocs=2, join=True)
        r0, r1 = (torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in (0, 1))
    assert r0["revived"] == r1["revived"] == 2
    assert torch.equal(r0["vectors"], r1["vectors"])


def test_two_rank_all_reduce_keeps_codebooks_identical():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_ddp_worker, args=(2, os.path.join(tmp, "init"), tmp), nprocs=2, join=True)
        r0, r1 = (torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in (0, 1))
    for key in ("vectors", "cluster_size", "embed_sum", "window_counts"):
        assert torch.equal(r0[f"codebook.{key}"], r1[f"codebook.{key}"]), key
    assert r0["codebook.cluster_size"].sum() > 16  # both ranks' counts were summed, not just one rank's


@pytest.mark.parametrize("shape", [(0, 4), (1, 4)])
def test_empty_and_single_token_inputs(shape):
    q = EMAQuantizer(8, 4).train()
    z = torch.randn(1, *shape) if shape[0] else torch.randn(1, 0, 4)
    out = q(z)
    assert out.indices.shape == z.shape[:-1]


def test_the_quantizer_alone_applies_beta():
    z = torch.randn(2, 5, 4)
    losses = {}
    for beta in (0.0, 0.25):
        torch.manual_seed(0)  # the same initial codebook for both
        losses[beta] = EMAQuantizer(8, 4, beta=beta).eval()(z)
    for beta, out in losses.items():
        expected = out.codebook_loss + beta * out.commitment_loss
        torch.testing.assert_close(out.vq_loss, expected, rtol=0, atol=0)
    assert float(losses[0.25].vq_loss) > float(losses[0.0].vq_loss) > 0


def test_the_vq_loss_reaches_the_encoder_through_the_commitment_term_weighted_by_beta() -> None:
    """d vq_loss / dz = β · 2 (z − e) / n (docs/design.md §1.6): only the commitment term has a
    gradient into z, and β weighs it. The loss values alone cannot tell a β on the wrong term, nor a
    detached commitment term (the two terms are equal in value)."""
    torch.manual_seed(0)
    beta = 0.25
    quantizer = EMAQuantizer(8, 4, beta=beta).eval()
    z = torch.randn(1, 5, 4, requires_grad=True)
    out = quantizer(z, with_entropy=False)
    out.vq_loss.backward()
    assert z.grad is not None
    codes = quantizer.codebook.vectors[out.indices.reshape(-1)]
    torch.testing.assert_close(z.grad.reshape(-1, 4), beta * 2 * (z.detach().reshape(-1, 4) - codes) / 5)
