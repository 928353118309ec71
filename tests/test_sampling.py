"""Sampling: greedy, temperature, top-k, top-p, min-p; seeds and batch invariance; the filters;
top_k. The CPU tier runs the interpreted kernels (TRITON_INTERPRET=1) or the reference.

Exactness is shown two ways: the kernels return the same tokens as the NumPy reference (same
Philox numbers, same float32 race), and the reference passes chi-square tests against the
float64 filtered distribution over many draws; the kernels pass them too, with fewer draws on
the CPU (the interpreter is slow) and many on the GPU.
"""
import fractions
import math

import numpy as np
import pytest
import torch

import triton
import triton.language as tl

import treefold
from treefold import backend
from treefold._ops import sampling as ops
from treefold._ops.launch import PreparedPipeline, dependent_launch
from treefold.kernels import sampling as kernels
from treefold.reference import sampling as ref

from conftest import CUDA, InterpretedPrepared, prepare_through_the_interpreter

KERNEL = CUDA or backend.INTERPRETED
#: Upper tail of the standard normal for the chi-square critical values (alpha ~ 1e-6): the
#: draws are seeded, so a pass is reproducible and a failure means a real discrepancy.
Z_CRITICAL = 4.75


def chi2_critical(dof: int, z: float = Z_CRITICAL) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (no scipy needed)."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def chi_square(tokens: torch.Tensor, probs: np.ndarray):
    """(statistic, dof) of draws against probs; categories expecting < 5 are pooled."""
    draws = tokens.numel()
    counts = np.bincount(tokens.cpu().numpy(), minlength=probs.size).astype(np.float64)
    expected = probs * draws
    big = expected >= 5
    obs = list(counts[big]) + [counts[~big].sum()]
    exp = list(expected[big]) + [expected[~big].sum()]
    if exp[-1] < 5:  # fold a tiny pooled bin into the smallest category
        j = int(np.argmin(exp[:-1]))
        obs[j] += obs.pop()
        exp[j] += exp.pop()
    obs, exp = np.array(obs), np.array(exp)
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1


def logits_row(n: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * scale


# --------------------------------------------------------------------------------------------
# Random numbers
# --------------------------------------------------------------------------------------------

@triton.jit
def noise_kernel(out_at, out_tile, seed, stream, offset, N: tl.constexpr):
    tokens = tl.arange(0, N).to(tl.int64) * 7 + 3
    tl.store(out_at + tl.arange(0, N), kernels._noise_at(tokens, seed, stream, offset))
    tl.store(out_tile + tl.arange(0, N), kernels._noise_tile(5, seed, stream, offset, N // 4))


@pytest.mark.skipif(not KERNEL, reason="needs TRITON_INTERPRET=1 or a GPU")
def test_kernel_noise_equals_reference_bits(device):
    n = 64
    out_at = torch.full((n,), float("nan"), device=device)
    out_tile = torch.full((n,), float("nan"), device=device)
    seed, stream, offset = -123456789012345, 7, (5 << 32) + 11
    noise_kernel[(1,)](out_at, out_tile, seed, stream, offset, N=n)
    want_at = ref.race_noise(np.arange(n) * 7 + 3, seed, stream, offset)
    want_tile = ref.race_noise(np.arange(n) + 20, seed, stream, offset)
    if CUDA:  # fast division and lg2.approx: within 2^-21 of the noise of the same u, plus the
        # reference's own float32 rounding (``kernels._race_noise``)
        for got, want in ((out_at, want_at), (out_tile, want_tile)):
            err = np.abs(got.cpu().numpy().astype(np.float64) - want.astype(np.float64))
            assert (err <= 2.0 ** -21 + 2 * np.spacing(np.abs(want))).all(), err.max()
    else:
        assert out_at.numpy().tobytes() == want_at.tobytes()
        assert out_tile.numpy().tobytes() == want_tile.tobytes()


@triton.jit
def weights_and_bins_kernel(y_ptr, m, mass_out, weight_out, bin_out, gap_bin_out, near_out, N: tl.constexpr):
    y = tl.load(y_ptr + tl.arange(0, N))
    finite = tl.abs(y) < float("inf")
    w, w_fixed = kernels._fixed_mass(y, m, finite)
    gap = kernels._gap(y, m, finite)
    tl.store(mass_out + tl.arange(0, N), w_fixed)
    tl.store(weight_out + tl.arange(0, N), kernels._fixed_weight(gap))
    tl.store(bin_out + tl.arange(0, N), kernels._bin_of(y, y, m, finite, 64, 4.0, True))
    tl.store(gap_bin_out + tl.arange(0, N), kernels._bin_of_gap(y, gap, finite, 64, 4.0, True))
    tl.store(near_out + tl.arange(0, N), kernels._in_first_bins(y, gap, 40, 4.0, True).to(tl.int32))


@pytest.mark.skipif(not KERNEL, reason="needs TRITON_INTERPRET=1 or a GPU")
def test_histogram_weights_and_bins_equal_the_other_passes(device):
    # The histogram pass takes each token's bin and fixed-point weight from one difference y - m,
    # with a flush-to-zero exp (compiled); every other pass with ``_fixed_mass`` and ``_bin_of``.
    # Masses are compared across passes, so the two must agree bit for bit: gaps from 0 to -200
    # nats cross both 2^-40 (weights that truncate to 0) and 2^-126 (where the exps differ).
    n = 4096
    gaps = torch.linspace(0.0, -200.0, n - 8, dtype=torch.float64)
    m = 3.25
    # (m is the row maximum: no finite y lies above it)
    y = torch.cat([(m + gaps).float(), torch.tensor([m, -1e30, -3e38, float("inf"), float("-inf"),
                                                    float("nan"), m - 87.336, m - 87.337])])
    y[1], y[2] = m - 10.0, m - 9.75  # exactly on the edges of bins 40 and 39
    y = y.to(device)
    outs = [torch.full((n,), -7, dtype=torch.int64, device=device) for _ in range(2)]
    bins = [torch.full((n,), -7, dtype=torch.int32, device=device) for _ in range(2)]
    near = torch.full((n,), -7, dtype=torch.int32, device=device)
    weights_and_bins_kernel[(1,)](y, m, outs[0], outs[1], bins[0], bins[1], near, N=n)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(bins[0], bins[1])
    # the histogram's pre-list marks (the first 40 bins, 10 nats) without the bin
    assert torch.equal(near, (bins[0] < 40).to(torch.int32))
    assert 0 < int(near.sum()) < n and near[1:3].tolist() == [0, 1]
    assert int(outs[0][0]) > 0  # (not all zero)
    assert outs[0][-5:-2].tolist() == [0, 0, 0]  # +inf, -inf and NaN weigh nothing


def test_philox_known_answer():
    # Random123's known-answer vectors for Philox4x32-10
    r = ref.philox4x32(0, 0, 0, 0, 0)
    assert [int(v) for v in r] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    key = np.uint64(0x299F31D0A4093822).view(np.int64)  # key words (0xA4093822, 0x299F31D0)
    r = ref.philox4x32(key, 0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
    assert [int(v) for v in r] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_race_noise_is_gumbel():
    g = ref.race_noise(np.arange(400_000), seed=99, stream=0, offset=0).astype(np.float64)
    assert np.isfinite(g).all()
    e = np.exp(-g)  # E = exp(-g) ~ Exp(1)
    # chi-square of E against Exp(1) on 50 equiprobable bins
    edges = -np.log1p(-np.arange(1, 50) / 50.0)
    counts = np.bincount(np.searchsorted(edges, e), minlength=50)
    stat = ((counts - e.size / 50) ** 2 / (e.size / 50)).sum()
    assert stat < chi2_critical(49)
    assert abs(e.mean() - 1.0) < 5 * 1.0 / math.sqrt(e.size)


# --------------------------------------------------------------------------------------------
# Greedy
# --------------------------------------------------------------------------------------------

def test_greedy_ties_go_to_lowest_index(device):
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0, 3.0],
                      [float("nan"), 0.5, float("inf"), 0.5, -0.0],
                      [-0.0, 0.0, -1.0, -5.0, -0.0]], device=device)
    want = torch.tensor([1, 1, 0], device=device)
    assert torch.equal(treefold.sample(x, temperature=0.0), want)
    assert torch.equal(treefold.sample(x, temperature=0.0, top_k=2, top_p=0.3), want)
    t = torch.tensor([0.0, 0.0, 0.0], device=device)
    assert torch.equal(treefold.sample(x, temperature=t, top_k=2, seed=1), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_matches_argmax(device, dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 300, generator=g) * 4).to(dtype).to(device)
    assert torch.equal(treefold.sample(x, temperature=0), x.float().argmax(-1))


# --------------------------------------------------------------------------------------------
# Kernels == reference, token for token
# --------------------------------------------------------------------------------------------

CONFIGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.9, top_k=9, top_p=0.85, min_p=0.02),
]


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kernels_equal_reference(device, config, dtype):
    rows, n = 6, 41
    g = torch.Generator().manual_seed(len(str(config)))
    x = (torch.randn(rows, n, generator=g) * 2).to(dtype)
    x[0, 7] = float("nan")
    x[1, 3] = float("-inf")
    x[2, 11] = float("inf")
    seeds = torch.arange(rows, dtype=torch.int64) * 1000003 - 5
    got = treefold.sample(x.to(device), seed=seeds.to(device), offset=17, **config).cpu()
    want = ref.sample(x, seed=seeds, offset=17, **config)
    probs = ref.filtered_probs(x, **{k: v for k, v in config.items()})
    assert (probs[torch.arange(rows), got] > 0).all(), "a filtered-out token was drawn"
    if CUDA:  # exp/log differ in the last bits on the GPU: a race between near-equal scores may flip
        assert (got == want).float().mean() >= 0.8
    else:
        assert torch.equal(got, want)


# --------------------------------------------------------------------------------------------
# Exact distribution: chi-square against the float64 filtered distribution
# --------------------------------------------------------------------------------------------

STAT_LOGITS = torch.tensor([2.0, 1.8, 1.6, 1.5, 1.2, 1.0, 0.6, 0.1, -0.5, -1.0, -2.0, 0.9])
STAT_CONFIGS = [
    dict(temperature=1.0),
    dict(temperature=0.8, top_k=6),
    dict(temperature=1.2, top_p=0.7),
    dict(temperature=1.0, top_k=8, top_p=0.8, min_p=0.3),
    dict(temperature=0.9, min_p=0.25),
]


@pytest.mark.parametrize("config", STAT_CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_reference_chi_square(config):
    draws = 20_000
    x = STAT_LOGITS.expand(draws, -1)
    tokens = ref.sample(x, seed=torch.arange(draws), offset=3, **config)
    probs = ref.filtered_probs(STAT_LOGITS[None], **config)[0].numpy()
    assert (probs[tokens.numpy()] > 0).all()
    stat, dof = chi_square(tokens, probs)
    assert stat < chi2_critical(dof), (stat, dof, probs)


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
@pytest.mark.parametrize("config", STAT_CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_kernel_chi_square(device, config):
    # many rows with different seeds in one call (the interpreter runs programs one by one)
    draws = 20_000 if CUDA else (240 if len(config) == 1 else 60)
    x = STAT_LOGITS.to(device).expand(draws, -1)
    tokens = treefold.sample(x, seed=torch.arange(draws, device=device) + 77, **config)
    probs = ref.filtered_probs(STAT_LOGITS[None], **config)[0].numpy()
    assert (probs[tokens.cpu().numpy()] > 0).all()
    stat, dof = chi_square(tokens, probs)
    assert stat < chi2_critical(dof), (stat, dof)


#: Two requests in one batch, each with its own temperature, top-k, top-p and min-p (per-row
#: tensors): each must draw from its own filtered distribution. Every kind of parameter tells the
#: rows apart somewhere: given the other row's value, request 0's temperature, top-p or min-p
#: and request 1's temperature, top-k or top-p change the set that row draws from (5 tokens
#: each), so a row that reads another row's parameter draws a token its own filters removed.
PER_ROW = dict(temperature=torch.tensor([0.7, 1.4]), top_k=torch.tensor([9, 12]),
               top_p=torch.tensor([0.9, 0.6]), min_p=torch.tensor([0.3, 0.0]))


def _per_row_chi_square(sample, draws: int, device):
    params = {k: v.repeat_interleave(draws).to(device) for k, v in PER_ROW.items()}
    x = STAT_LOGITS.to(device).expand(2 * draws, -1)
    seeds = torch.arange(2 * draws, device=device) + 5
    tokens = sample(x, seed=seeds, offset=2, **params).cpu()
    if sample is not ref.sample and not CUDA:  # the interpreter's draws are the reference's
        params_cpu = {k: v.cpu() for k, v in params.items()}
        assert torch.equal(tokens, ref.sample(x.cpu(), seed=seeds.cpu(), offset=2, **params_cpu))
    for request in range(2):
        own = {k: v[request:request + 1] for k, v in PER_ROW.items()}
        probs = ref.filtered_probs(STAT_LOGITS[None], **own)[0].numpy()
        part = tokens[request * draws:(request + 1) * draws]
        assert (probs[part.numpy()] > 0).all(), f"request {request} drew a token its filters removed"
        stat, dof = chi_square(part, probs)
        assert stat < chi2_critical(dof), (request, stat, dof, probs)


def test_reference_chi_square_with_per_row_parameters():
    _per_row_chi_square(ref.sample, 10_000, "cpu")


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_kernel_chi_square_with_per_row_parameters(device):
    # the interpreter runs programs one by one: few draws on the CPU, where the kernels must
    # equal the reference token for token, which carries the reference's 10,000-draw test over
    _per_row_chi_square(treefold.sample, 10_000 if CUDA else 60, device)


def test_composition_order_top_k_then_top_p_then_min_p(device):
    x = torch.log(torch.tensor([[0.3, 0.25, 0.2, 0.15, 0.1]], dtype=torch.float64)).float()
    # top-k 3 renormalises to 0.4, 0.333, 0.267: top-p 0.6 keeps two tokens (on the full
    # distribution it would keep three: 0.3 + 0.25 < 0.6)
    kept = ref.filtered_probs(x, top_k=3, top_p=0.6)[0] > 0
    assert kept.tolist() == [True, True, False, False, False]
    # then min-p 0.9: 0.25 / 0.3 < 0.9
    kept = ref.filtered_probs(x, top_k=3, top_p=0.6, min_p=0.9)[0] > 0
    assert kept.tolist() == [True, False, False, False, False]
    xs = x.to(device)
    masked = treefold.top_p_mask(treefold.top_k_mask(xs, 3), 0.6)
    assert torch.isfinite(masked[0]).cpu().tolist() == [True, True, False, False, False]
    draws = 16 if backend.INTERPRETED else 2000
    tokens = treefold.sample(xs.expand(draws, -1), top_k=3, top_p=0.6,
                             seed=torch.arange(draws, device=device))
    assert set(tokens.cpu().tolist()) == {0, 1}
    tokens = treefold.sample(xs.expand(8, -1), top_k=3, top_p=0.6, min_p=0.9,
                             seed=torch.arange(8, device=device))
    assert set(tokens.cpu().tolist()) == {0}


# --------------------------------------------------------------------------------------------
# Seeds, offsets, batch invariance, determinism
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [dict(), dict(top_k=4, top_p=0.9)], ids=["race", "filtered"])
def test_batch_invariance(device, config):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, 64, generator=g).to(device) * 2
    seeds = torch.tensor([3, 1, 4, 1, 5, 9, 2], device=device)
    offsets = torch.tensor([0, 1, 2, 3, 4, 5, 6], device=device)
    batch = treefold.sample(x, seed=seeds, offset=offsets, **config)
    perm = torch.tensor([4, 0, 6, 2, 1, 5, 3], device=device)
    shuffled = treefold.sample(x[perm], seed=seeds[perm], offset=offsets[perm], **config)
    assert torch.equal(shuffled, batch[perm])
    for r in (0, 5):
        alone = treefold.sample(x[r:r + 1], seed=seeds[r:r + 1], offset=offsets[r:r + 1], **config)
        assert alone.item() == batch[r].item()
    if KERNEL and device == "cpu":  # launch choices never change a token
        args = (1.0, config.get("top_k"), config.get("top_p"), None, seeds, offsets)
        one = ops.sample_rows(x, *args, programs_per_row=1)
        two = ops.sample_rows(x, *args, programs_per_row=2)
        assert torch.equal(one, batch) and torch.equal(two, batch)


def test_seeds_offsets_and_default_generator(device):
    x = torch.zeros(1, 50, device=device).expand(16, -1)  # uniform over 50 tokens
    a = treefold.sample(x, seed=11, offset=0)
    assert torch.equal(a, treefold.sample(x, seed=11, offset=0))
    assert len(set(a.tolist())) > 8, "one seed for the batch still gives every row its own stream"
    b = treefold.sample(x, seed=11, offset=1)
    assert not torch.equal(a, b)
    assert torch.equal(a, treefold.sample(x, seed=torch.tensor([11], device=device), offset=0))
    torch.manual_seed(1234)
    c = treefold.sample(x)
    d = treefold.sample(x)
    torch.manual_seed(1234)
    assert torch.equal(c, treefold.sample(x)) and not torch.equal(c, d)
    state = torch.random.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state()
    treefold.sample(x, temperature=0.0)  # greedy draws nothing
    after = torch.random.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state()
    assert torch.equal(state, after)
    big = treefold.sample(x[:2], seed=(1 << 64) - 1, offset=(1 << 40) + 3)
    assert torch.equal(big, treefold.sample(x[:2], seed=-1, offset=(1 << 40) + 3))


def test_same_call_same_bits(device):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, 90, generator=g).to(device)
    for config in (dict(), dict(top_p=0.6, min_p=0.05)):
        a = treefold.sample(x, seed=5, **config)
        assert torch.equal(a, treefold.sample(x, seed=5, **config))
    m1 = treefold.top_p_mask(x, 0.6, probs=True)
    assert m1.cpu().numpy().tobytes() == treefold.top_p_mask(x, 0.6, probs=True).cpu().numpy().tobytes()


# --------------------------------------------------------------------------------------------
# Documented results for bad rows; errors for bad arguments
# --------------------------------------------------------------------------------------------

def test_bad_rows_sample_minus_one(device):
    n = 20
    x = torch.randn(9, n).to(device)
    x[7] = float("-inf")
    x[8] = float("nan")
    t = torch.tensor([1.0, -1.0, float("nan"), float("inf"), 1.0, 1.0, 1.0, 1.0, 0.0], device=device)
    k = torch.tensor([3, 3, 3, 3, 0, n + 1, 3, 3, 3], device=device)
    p = torch.tensor([0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.0, 0.9, 0.9], device=device)
    mp = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.5], device=device)
    seeds = torch.full((9,), 1, device=device)
    # below the argument checks (kernels or reference) every bad row gives -1, parameters or
    # logits, on every device
    out = ops.sample(x, t, k, p, mp, seeds, 0).cpu()
    assert out[0] >= 0 and out[1:].tolist() == [-1] * 8
    assert ops.sample(x[7:], 1.0, None, None, None, seeds[:2], 0).tolist() == [-1, -1]
    assert ops.sample(x[7:], 0.0, None, None, None, seeds[:2], 0).tolist() == [-1, -1]
    assert ops.sample(x[7:], 1.0, 2, None, None, seeds[:2], 0).tolist() == [-1, -1]
    if x.is_cuda:  # the graph-safe path: no host synchronisation, the documented -1
        out = treefold.sample(x, temperature=t, top_k=k, top_p=p, min_p=mp, seed=1).cpu()
        assert out[0] >= 0 and out[1:].tolist() == [-1] * 8
        assert treefold.sample(x[7:], seed=1).tolist() == [-1, -1]
        assert treefold.sample(x[7:], temperature=0).tolist() == [-1, -1]
        bad_t = torch.tensor([-0.5], device=device)
        assert treefold.sample(x[:1], temperature=bad_t, seed=0).tolist() == [-1]
    else:  # on the host: a bad row, of parameters or of logits, is an error naming the rows
        with pytest.raises(ValueError, match=r"row\(s\) 7, 8 .*no finite value"):
            treefold.sample(x, temperature=t[0], top_k=3, seed=1)
        with pytest.raises(ValueError, match=r"row\(s\) 1 .*no finite value"):
            treefold.sample(x[6:8].reshape(1, 2, n), temperature=0)
        with pytest.raises(ValueError, match=r"sample: temperature is out of range in row\(s\) 1, 2, 3 .*"
                                             r"got -1.0, expected finite and >= 0"):
            treefold.sample(x, temperature=t, top_k=k, top_p=p, min_p=mp, seed=1)
        with pytest.raises(ValueError, match=r"sample: top_k is out of range in row\(s\) 4, 5 .*got 0, "
                                             r"expected in \[1, 20\]"):
            treefold.sample(x[:7], top_k=k[:7], seed=1)
        with pytest.raises(ValueError, match=r"sample: top_p is out of range in row\(s\) 6 .*got 0.0"):
            treefold.sample(x[:7], top_p=p[:7], seed=1)
        with pytest.raises(ValueError, match=r"sample: min_p is out of range in row\(s\) 6 .*got 1.5"):
            treefold.sample(x[:7], min_p=mp[2:], seed=1)
        with pytest.raises(ValueError, match=r"top_k_mask: k is out of range in row\(s\) 4, 5"):
            treefold.top_k_mask(x[:7], k[:7])


def test_unit_temperature_reads_the_logits_unscaled_with_the_same_tokens(device):
    # a scalar temperature of 1 (or 0) has the row passes take the logits as they are (UNIT_T:
    # no multiply, no clamp); a per-row tensor of ones (or zeros) scales and clamps them: the
    # same tokens under every filter, with NaN, +-inf and logits near the float32 limit in the rows
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, 300, generator=g) * 4
    x[0, 3], x[0, 9], x[1, 5] = float("nan"), float("inf"), float("-inf")
    x[1, 7], x[2, 11], x[2, 12] = 3.0e38, -3.0e38, float("inf")
    x = x.to(device)
    for config in ({}, dict(top_p=0.9), dict(min_p=0.05), dict(top_k=20), dict(top_k=20, top_p=0.8)):
        for t in (1.0, 0.0):
            scalar = treefold.sample(x, temperature=t, seed=4, **config)
            per_row = treefold.sample(x, temperature=torch.full((3,), t, device=device), seed=4, **config)
            assert torch.equal(scalar, per_row), (config, t)
            assert scalar[1] == 7 or t == 1.0  # greedy: the largest finite logit


def test_non_finite_logits_are_never_drawn(device):
    x = torch.zeros(40, 6)
    x[:, 0] = float("nan")
    x[:, 1] = float("inf")
    x[:, 2] = float("-inf")
    x = x.to(device)
    for config in (dict(), dict(top_k=2), dict(top_p=0.9)):
        tokens = treefold.sample(x[:8], seed=torch.arange(8, device=device), **config)
        assert set(tokens.tolist()) <= {3, 4, 5}


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(temperature=-1.0), ValueError, "sample: temperature must be >= 0.0, got -1.0"),
    (dict(temperature=float("inf")), ValueError, "sample: temperature must be finite, got inf"),
    (dict(temperature="hot"), TypeError, "sample: temperature must be a number, got str"),
    # the kernels take temperature and p as float32: a value that rounds to inf or 0 there is out of range
    (dict(temperature=1e39), ValueError, r"sample: temperature=1e\+39 overflows float32"),
    (dict(temperature=2.0 ** 128 - 2.0 ** 103), ValueError, r"overflows float32"),  # the first that does
    (dict(top_p=1e-50), ValueError, r"sample: top_p=1e-50 rounds to 0 in float32"),
    (dict(top_p=2.0 ** -150), ValueError, r"rounds to 0 in float32"),  # the last that does
    (dict(top_k=0), ValueError, r"sample: top_k=0 is out of range for 10 tokens"),
    (dict(top_k=11), ValueError, r"sample: top_k=11 is out of range for 10 tokens"),
    (dict(top_k=2.0), TypeError, "sample: top_k must be an int, a tensor or None, got float"),
    (dict(top_p=0.0), ValueError, r"sample: top_p=0.0 is outside \(0, 1\]"),
    (dict(top_p=1.5), ValueError, r"sample: top_p=1.5 is outside \(0, 1\]"),
    (dict(top_p=float("nan")), ValueError, r"sample: top_p=nan is outside \(0, 1\]"),
    (dict(min_p=-0.1), ValueError, r"sample: min_p=-0.1 is outside \[0, 1\]"),
    # numbers past float's range (float() of them raises OverflowError, naming nothing)
    (dict(temperature=10 ** 400), ValueError, "sample: temperature must be finite, got a number too large"),
    (dict(temperature=fractions.Fraction(10 ** 400)), ValueError, "sample: temperature must be finite"),
    (dict(top_p=10 ** 400), ValueError, r"sample: top_p is outside \(0, 1\] \(a number too large for a float\)"),
    (dict(min_p=-10 ** 400), ValueError, r"sample: min_p is outside \[0, 1\] \(a number too large"),
    (dict(seed=1 << 64), ValueError, "sample: seed=18446744073709551616 does not fit in 64 bits"),
    (dict(seed=1.5), TypeError, "sample: seed must be an int or an integer tensor, got float"),
    (dict(offset=True), TypeError, "sample: offset must be an int or an integer tensor, got bool"),
    (dict(top_p=torch.ones(3, dtype=torch.int64)), TypeError,
     "sample: top_p has dtype int64, expected one of float32, float64, bfloat16, float16"),
    (dict(top_k=torch.ones(3, dtype=torch.int64)), ValueError,
     r"sample: top_k has shape \(3,\), expected one element or \(2,\) \(one per row of logits\)"),
    (dict(seed=torch.ones(2)), TypeError, "sample: seed has dtype float32, expected int64 or int32"),
    # per-row parameters are dense tensors (a sparse one has no reshape: named, not a RuntimeError)
    (dict(temperature=torch.ones(2).to_sparse()), TypeError, "sample: temperature is a sparse_coo tensor"),
    (dict(top_k=torch.full((2,), 3).to_sparse()), TypeError, "sample: top_k is a sparse_coo tensor"),
    (dict(seed=torch.arange(2).to_sparse()), TypeError, "sample: seed is a sparse_coo tensor"),
    (dict(offset=torch.arange(2).to_sparse()), TypeError, "sample: offset is a sparse_coo tensor"),
])
def test_sample_argument_errors(kwargs, exc, message):
    x = torch.randn(2, 10)
    with pytest.raises(exc, match=message):
        treefold.sample(x, **kwargs)


def test_scalars_are_checked_as_they_round_to_float32(monkeypatch):
    # the kernels take temperature, p and min_p as float32: the largest temperature that rounds
    # to a finite one and the smallest p that does not round to 0 pass; a temperature that
    # rounds to 0 is greedy, and draws nothing from torch's generator
    calls = []
    monkeypatch.setattr(treefold.functional.sampling._ops, "sample",
                        lambda x, *args: calls.append(args) or torch.zeros(x.shape[0], dtype=torch.int64))
    x = torch.randn(2, 10)
    top_t, low_p = math.nextafter(2.0 ** 128 - 2.0 ** 103, 0.0), math.nextafter(2.0 ** -150, 1.0)
    treefold.sample(x, temperature=top_t, top_p=low_p, seed=1)
    assert calls[-1][0] == top_t and calls[-1][2] == low_p
    assert float(torch.tensor(top_t, dtype=torch.float32)) < math.inf
    assert float(torch.tensor(low_p, dtype=torch.float32)) > 0.0
    state = torch.get_rng_state()
    treefold.sample(x, temperature=2.0 ** -150)
    assert calls[-1][0] == 0.0 and calls[-1][4] == 0 and torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match=r"sample: temperature is out of range in row\(s\) 1 .*got inf, "
                                         r"expected finite and >= 0 \(as float32\)"):
        treefold.sample(x, temperature=torch.tensor([1.0, 1e39], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"sample: top_p is out of range in row\(s\) 0 .*got 0.0"):
        treefold.sample(x, top_p=torch.tensor([1e-50, 0.5], dtype=torch.float64))


def _same_arguments(a, b) -> bool:
    def same(u, v):
        if isinstance(u, torch.Tensor) or isinstance(v, torch.Tensor):
            return torch.equal(u, v)
        return u == v and type(u) is type(v)
    return len(a) == len(b) and all(map(same, a, b))


def test_validated_kinds_skip_the_checks_with_the_parameters_the_checks_gave(monkeypatch):
    """An eager call of a kind that passed the checks before (``_validated_kind``) takes the
    normalised parameters kept for it: the same ones the checks give (filters that keep every
    token dropped, numbers as floats, tensors as they are). Kinds hold the scalar values, so a
    bad value never finds a kind and raises as before, even after a good call alike."""
    from treefold.functional import sampling as public
    calls = []

    def record(x, *args):
        calls.append((x, args))
        return torch.zeros(x.shape[0], dtype=torch.int64)

    monkeypatch.setattr(public, "_fast_device", lambda logits: True)  # the path CUDA calls take
    monkeypatch.setattr(public, "_VALIDATED", {})
    monkeypatch.setattr(public._ops, "sample", record)
    x = torch.randn(2, 10)
    for kwargs in (dict(seed=5), dict(temperature=0.7, top_k=10, top_p=1.0, min_p=0.0, seed=5, offset=2),
                   dict(temperature=1, top_k=3, top_p=0.5, seed=torch.tensor([3, 4]), offset=torch.tensor([7])),
                   dict(temperature=0, seed=(1 << 63) - 1, offset=-(1 << 63))):
        calls.clear()
        treefold.sample(x, **kwargs)  # checked, and its kind kept
        treefold.sample(x, **kwargs)  # the kept parameters
        (x_checked, checked), (x_kept, kept) = calls
        assert torch.equal(x_checked, x) and x_kept is x and _same_arguments(checked, kept), kwargs
    assert len(public._VALIDATED) == 4
    # bad values raise though a call of the kind but for them was good
    for good, bad, exc in ((dict(top_k=10), dict(top_k=11), ValueError),
                           (dict(top_p=0.5), dict(top_p=1.5), ValueError),
                           (dict(top_p=0.5), dict(top_p=float("nan")), ValueError),
                           (dict(temperature=1.0), dict(temperature=float("inf")), ValueError),
                           (dict(offset=1), dict(offset=True), TypeError),
                           (dict(offset=1), dict(offset=1 << 64), ValueError),
                           (dict(top_k=2), dict(top_k=2.0), TypeError)):
        treefold.sample(x, seed=1, **good)
        for _ in range(2):
            with pytest.raises(exc):
                treefold.sample(x, seed=1, **bad)
    # kinds that always take the checks
    kind = public._validated_kind
    seeds = torch.tensor([3, 4])
    assert kind(x, 1.0, None, None, None, 1, 0) is not None
    assert kind(x, 1.0, None, None, None, seeds, 0) is not None
    assert all(k is None for k in (
        kind(x.reshape(1, 2, 10), 1.0, None, None, None, 1, 0), kind(x.t(), 1.0, None, None, None, 1, 0),
        kind(x, torch.ones(2), None, None, None, 1, 0), kind(x, 1.0, True, None, None, 1, 0),
        kind(x, 1.0, None, None, None, None, 0), kind(x, 1.0, None, None, None, 1 << 63, 0),
        kind(x, 1.0, None, None, None, seeds.int(), 0),
        kind(x, 1.0, None, None, None, torch.arange(4)[::2], 0),
        kind(x, 1.0, None, None, None, seeds.reshape(2, 1), 0)))
    monkeypatch.setattr(public, "_fast_device", lambda logits: False)
    assert kind(x, 1.0, None, None, None, 1, 0) is None


def test_logits_errors():
    with pytest.raises(TypeError, match="sample: logits must be a torch.Tensor, got list"):
        treefold.sample([1.0, 2.0])
    with pytest.raises(TypeError, match="sample: logits has dtype int64"):
        treefold.sample(torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="sample: logits must have at least one dimension"):
        treefold.sample(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"sample: logits has an empty last dimension \(shape \(2, 0\)\)"):
        treefold.sample(torch.ones(2, 0))
    with pytest.raises(ValueError, match="rows longer than 1048576"):
        treefold.sample(torch.zeros(1, (1 << 20) + 1))
    with pytest.raises(ValueError, match=r"top_k: k=4 is out of range for 3 tokens"):
        treefold.top_k(torch.ones(2, 3), 4)
    with pytest.raises(TypeError, match="top_k: k must be an int, got Tensor"):
        treefold.top_k(torch.ones(2, 3), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"top_p_mask: p=2 is outside \(0, 1\]"):
        treefold.top_p_mask(torch.ones(2, 3), 2)
    with pytest.raises(ValueError, match=r"top_p_mask: p=1.0000001 is outside \(0, 1\]"):
        treefold.top_p_mask(torch.ones(2, 3), 1.0000001)
    # a scalar is checked as it rounds to float32, as a tensor's values are: 1 + 2^-25 is 1
    assert torch.equal(treefold.top_p_mask(torch.ones(2, 3), 1 + 2 ** -25), torch.ones(2, 3))
    with pytest.raises(TypeError, match="min_p_mask: probs must be a bool, got int"):
        treefold.min_p_mask(torch.ones(2, 3), 0.1, probs=1)
    with pytest.raises(TypeError, match="top_k_mask: k must be an int or a tensor, got NoneType"):
        treefold.top_k_mask(torch.ones(2, 3), None)
    with pytest.raises(TypeError, match="top_p_mask: p must be a number or a tensor, got str"):
        treefold.top_p_mask(torch.ones(2, 3), "0.9")
    with pytest.raises(TypeError, match="min_p_mask: min_p must be a number or a tensor, got NoneType"):
        treefold.min_p_mask(torch.ones(2, 3), None)
    with pytest.raises(TypeError, match="sample: top_p must be a number, a tensor or None, got str"):
        treefold.sample(torch.ones(2, 3), top_p="0.9")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device for a second device")
def test_parameter_on_another_device():
    x = torch.randn(2, 10, device="cuda")
    with pytest.raises(ValueError, match="sample: temperature is on cpu, but logits is on cuda:0"):
        treefold.sample(x, temperature=torch.ones(2))


def test_shapes_empty_batch_and_strided_rows(device):
    assert treefold.sample(torch.randn(0, 5, device=device)).shape == (0,)
    assert treefold.sample(torch.randn(2, 0, 5, device=device)).shape == (2, 0)
    one = treefold.sample(torch.randn(7, device=device), seed=3)
    assert one.shape == () and 0 <= one.item() < 7
    g = torch.Generator().manual_seed(2)
    wide = torch.randn(4, 30, generator=g).to(device)
    x = wide[:, :19]  # rows strided by 30: read in place
    seeds = torch.arange(4, device=device)
    assert torch.equal(treefold.sample(x, seed=seeds, top_p=0.8),
                       treefold.sample(x.contiguous(), seed=seeds, top_p=0.8))
    x3 = wide.reshape(2, 2, 30)
    assert treefold.sample(x3, seed=1, top_k=3).shape == (2, 2)
    # a vector whose elements are not adjacent: copied
    v = torch.randn(20, generator=g).to(device)[::2]
    assert treefold.sample(v, temperature=0).item() == int(v.argmax())
    assert torch.equal(treefold.top_k(v, 3)[1], treefold.top_k(v.contiguous(), 3)[1])
    # a dimension of one entry between sliced ones: rows not one stride apart, copied
    heads = torch.randn(2, 1, 7, 19, generator=g).to(device)[:, :, :3]
    assert torch.equal(treefold.sample(heads, temperature=0), heads.argmax(-1))
    assert torch.equal(treefold.top_k(heads, 2)[1], treefold.top_k(heads.contiguous(), 2)[1])
    v, i = treefold.top_k(torch.randn(0, 9, device=device), 4)
    assert v.shape == (0, 4) and i.shape == (0, 4)
    assert treefold.top_p_mask(torch.randn(0, 9, device=device), 0.5).shape == (0, 9)


# --------------------------------------------------------------------------------------------
# top_k
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_k_equals_stable_sort(device, dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-4, 5, (5, 70), generator=g).to(dtype)  # many ties
    x[1, 5] = float("nan")
    x[1, 9] = float("inf")
    x[2, :] = float("-inf")
    x[3, 10] = -0.0
    x[4] = torch.randn(70, generator=g).to(dtype)
    xs = x.to(device)
    for k in (1, 6, 40, 70):
        values, indices = treefold.top_k(xs, k)
        want_v, want_i = ref.top_k(x, k)
        assert torch.equal(indices.cpu(), want_i), k
        assert torch.equal(values.cpu().view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
                           [~torch.isnan(values.cpu())],
                           want_v.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
                           [~torch.isnan(want_v)])
        assert values.dtype == dtype and indices.dtype == torch.int64


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_top_k_by_lane_maxima_equals_stable_sort(device, dtype, poison_allocations, monkeypatch):
    """``top_k_lanes_rows`` (two launches: group maxima, then the best groups' tokens sorted)
    gives the stable sort's first k, values bit for bit, with ties, NaN, +-inf, -0.0, rows of one
    segment and of several, for several splits of the rows among programs, with the finishing
    program's bound over a head shorter than k (k = 50, 64) and over every candidate (k = 1, 7),
    and with the tokens that reach the k-th group sorted alone or (KEPT 1) all of them sorted.
    Segments of 64 tokens (the interpreter sorts slowly), so that 300 tokens make five segments."""
    monkeypatch.setattr(ops, "MAX_WIDTH", 64)
    ops.plan.cache_clear()
    g = torch.Generator().manual_seed(8)
    x = torch.randint(-4, 5, (6, 300), generator=g).to(dtype)  # many ties, one lane holds several
    x[1, 5] = float("nan")
    x[1, 299] = float("inf")
    x[2, :] = float("-inf")
    x[3, 10] = -0.0
    x[3, 11:] = 0.0
    x[4] = torch.randn(300, generator=g).to(dtype)
    x[5] = (torch.randn(300, generator=g) * 4).to(dtype)
    xs = x.to(device)
    ks = (1, 7, 50, 64) if dtype == torch.float32 else (50,)
    wants = {k: ref.top_k(x, k) for k in ks}
    want_short = ref.top_k(x[:, :33], 33)[1]
    want_rows = ref.top_k(x[:, :150], 20)[1]
    short, rows = xs[:, :33].contiguous(), xs[:, :150]  # (rows of 150 with a stride of 300)
    poison_allocations()
    bits = torch.int16 if dtype != torch.float32 else torch.int32
    kept_default = ops.TOP_K_LANES_KEPT
    try:
        for k, (want_v, want_i) in wants.items():
            for programs in ((None, 1, 3) if dtype == torch.float32 else (None,)):
                for kept in ((kept_default, 1) if k == 50 else (kept_default,)):
                    monkeypatch.setattr(ops, "TOP_K_LANES_KEPT", kept)
                    values, indices = ops.top_k_lanes_rows(xs, k, programs_per_row=programs)
                    assert torch.equal(indices.cpu(), want_i), (k, programs, kept)
                    assert torch.equal(values.cpu().view(bits), want_v.view(bits)), (k, programs, kept)
                monkeypatch.setattr(ops, "TOP_K_LANES_KEPT", kept_default)
        assert torch.equal(ops.top_k_lanes_rows(short, 33)[1].cpu(), want_short)
        assert torch.equal(ops.top_k_lanes_rows(rows, 20)[1].cpu(), want_rows)
        empty = ops.top_k_lanes_rows(torch.empty(0, 100, device=device, dtype=dtype), 5)
        assert empty[0].shape == (0, 5) and empty[1].shape == (0, 5)
        for bad, match in ((0, "k must be from 1 to 64"), (65, "k must be from 1 to 64"),
                           (40, "more than the row")):
            with pytest.raises(ValueError, match=match):
                ops.top_k_lanes_rows(short, bad)
        with pytest.raises(ValueError, match="last dimension contiguous"):
            ops.top_k_lanes_rows(xs[:, ::2], 5)
    finally:
        ops.plan.cache_clear()


def test_top_k_by_lane_maxima_refuses_a_launch_that_sorts_too_many_tokens(monkeypatch):
    # one program per row of 151936 logits would gather 59600 tokens a row (k = 50, 8 lanes a
    # group, 149 segments): a sort whose compile does not end in useful time. The launch refuses
    # it before launching anything, naming the choice (here a bound of 256, segments of 64 tokens:
    # 300 logits are 5 segments, k = 60 takes groups of one lane, so one program gathers 300)
    monkeypatch.setattr(ops, "TOP_K_LANES_MAX_SORT", 256)
    x = torch.randn(2, 300)
    monkeypatch.setattr(ops, "MAX_WIDTH", 64)
    ops.plan.cache_clear()
    try:
        for call in (lambda: ops.top_k_lanes_rows(x, 60, programs_per_row=1),
                     lambda: ops.sample_top_k_lanes_rows(x, 1.0, 60, programs_per_row=1)):
            with pytest.raises(ValueError, match=r"1 programs per row of 300 logits gather 300 tokens a row "
                                                 r"for k=60, more than the 256"):
                call()
    finally:
        ops.plan.cache_clear()


def test_row_launches_refuse_rows_that_are_not_contiguous(device):
    # the launches read each row at x.stride(0) as contiguous: the public functions copy other
    # layouts first, and the launches themselves refuse them rather than read the wrong logits
    x = torch.randn(4, 64, device=device)[:, ::2]
    calls = (("sample_rows", lambda: ops.sample_rows(x, 1.0, top_p=0.9)),
             ("sample_rows", lambda: ops.sample_rows(x, 0.0)),  # the one-race launches
             ("sample_rows", lambda: ops.sample_rows(x.unsqueeze(0), 1.0)),
             ("top_k_rows", lambda: ops.top_k_rows(x, 5)),
             ("filter_rows", lambda: ops.filter_rows(x, top_p=0.9)))
    for name, call in calls:
        with pytest.raises(ValueError, match=f"{name}: x must be \\[rows, n\\] with contiguous rows"):
            call()


def mixed_rows(seed: int) -> torch.Tensor:
    """Six rows of 300 logits (N(0, 9)) for the tests that compare two paths' tokens: row 0 with
    NaN, +inf and -inf, row 1 rounded to whole numbers (ties), row 2 without a finite logit (its
    token is -1), row 3 with 20 finite logits."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(6, 300, generator=g) * 3).float()
    x[0, 7] = float("nan")
    x[0, 8] = float("inf")
    x[0, 9] = float("-inf")
    x[1] = torch.round(x[1])
    x[2, :] = float("-inf")
    x[3, 20:] = float("nan")
    return x


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_sampling_under_top_k_by_group_maxima_gives_the_pipelines_tokens(device, poison_allocations, monkeypatch):
    """``sample_top_k_lanes_rows`` (the top k by group maxima, filtered and raced) picks the
    token the pipeline picks (``sample_rows`` with the same filters), so that a request's token
    cannot depend on which of the two its batch takes: top-k alone, with top-p (scalar, and per
    row with one invalid p: -1; p = 1 and min_p = 0, which keep everything) and with min-p
    inside it; scalar and per-row temperatures (one invalid; 0, greedy), seeds and offsets; rows with NaN and +-inf (never kept), one without a finite
    logit (-1), one with fewer finite logits than k, ties; k = 1, 7, 50; several splits among
    programs. Segments of 64 tokens (the interpreter sorts slowly)."""
    monkeypatch.setattr(ops, "MAX_WIDTH", 64)
    ops.plan.cache_clear()
    x = mixed_rows(21)  # row 3: 20 finite logits, fewer than k = 50
    xs = x.to(device)
    seeds = torch.tensor([5, 11, 2, 9, 31, 7], device=device)
    offsets = torch.tensor([0, 3, 1, 4, 1, 5], device=device)
    temps = torch.tensor([0.7, 1.0, 1.3, 0.5, -1.0, 2.0], device=device)  # row 4 invalid: -1
    ps = torch.tensor([0.9, 0.5, 0.9, 0.3, 0.8, 1.5], device=device)  # row 5 invalid: -1
    mps = torch.tensor([0.5, 0.3, 0.5, 0.6, 0.4, 0.5], device=device)  # on hot rows: removes most of the mass
    poison_allocations()
    try:
        for k in (1, 7, 50):
            for temperature, p, mp, seed, offset in ((1.0, None, None, 3, 0), (0.7, None, None, seeds, offsets),
                                                     (temps, None, None, 17, offsets), (1.0, 0.9, None, seeds, 2),
                                                     (0.8, ps, 0.05, seeds, offsets), (2.0, None, mps, 5, 1),
                                                     (0.0, 0.9, None, 3, 0), (1.0, 1.0, 0.0, seeds, 1)):
                want = ops.sample_rows(xs, temperature, k, p, mp, seed, offset)
                for programs in ((None, 1, 3) if k == 50 else (None,)):
                    got = ops.sample_top_k_lanes_rows(xs, temperature, k, p, mp, seed, offset,
                                                      programs_per_row=programs)
                    assert torch.equal(got, want), (k, p, mp, programs, got, want)
                if isinstance(temperature, torch.Tensor):
                    assert got[2].item() == -1 and got[4].item() == -1
                if isinstance(p, torch.Tensor):
                    assert got[5].item() == -1
        with pytest.raises(ValueError, match="k must be from 1 to 64"):
            ops.sample_top_k_lanes_rows(xs, 1.0, 65)
    finally:
        ops.plan.cache_clear()


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_sampling_by_descent_gives_the_pipelines_tokens(device, poison_allocations, monkeypatch):
    """``sample_descent_rows`` (a race over the row, then rounds that keep the winner or race the
    tokens before it) picks the token the pipeline picks (``sample_rows`` with the same
    filters): top-p alone (0.9, 0.5, and 0.02, whose rows need many steps, most of them in the
    finishing program's loop), min-p alone (scalar, per row), both, per-row p with an invalid
    one (-1), p = 1 with min_p = 0 (keep everything), greedy with top-p (also an invalid one: the
    argmax, as the pipeline's one race gives); scalar and per-row temperatures (one greedy, one invalid),
    seeds and offsets; NaN and +-inf (never drawn), a row without a finite logit (-1), ties;
    bfloat16 logits; 1 to 3 rounds and several splits among programs; the finishing program's
    passes in segments of 32, 64 (the rounds'), 128 and 4096 (the default: the row in one); the
    rounds in one launch (``loop``, one program per row: the interpreter runs programs one after
    another, and more must wait for one another). Segments of 64 tokens."""
    monkeypatch.setattr(ops, "MAX_WIDTH", 64)
    ops.plan.cache_clear()
    x = mixed_rows(22)
    x[5] = x[5] * 0.05  # nearly flat: top-p keeps most of the row
    xs = x.to(device)
    xs_16 = xs.to(torch.bfloat16)  # (many ties)
    seeds = torch.tensor([5, 11, 2, 9, 31, 7], device=device)
    offsets = torch.tensor([0, 3, 1, 4, 1, 5], device=device)
    temps = torch.tensor([0.7, 0.0, 1.3, 0.5, -1.0, 2.0], device=device)  # row 1 greedy (ties), row 4 invalid: -1
    ps = torch.tensor([0.9, 0.5, 0.9, 0.3, 0.8, 1.5], device=device)  # row 5 invalid: -1
    mps = torch.tensor([0.5, 0.3, 0.5, 0.6, 0.4, 0.5], device=device)
    configs = ((1.0, 0.9, None, 3, 0), (0.7, 0.5, None, seeds, offsets), (temps, 0.9, None, 17, offsets),
               (0.8, ps, 0.05, seeds, offsets), (2.0, None, mps, 5, 1), (1.0, None, 0.1, seeds, 2),
               (1.0, 0.02, None, 3, 2), (1.0, 1.0, 0.0, seeds, 1), (0.0, 0.9, None, 3, 0),
               (0.0, 1.5, None, 3, 0), (1.0, 0.95, 0.2, 4, 4))
    wants = [ops.sample_rows(xs, t, None, p, mp, seed, offset) for t, p, mp, seed, offset in configs]
    want_16 = ops.sample_rows(xs_16, temps, None, 0.5, mps, seeds, offsets)
    poison_allocations()
    try:
        assert torch.equal(ops.sample_descent_rows(xs_16, temps, 0.5, mps, seeds, offsets, rounds=1, loop=False),
                           want_16)
        for (t, p, mp, seed, offset), want in zip(configs, wants):
            for programs, rounds, finish, loop in ((None, None, None, False), (1, 1, 0, False), (3, 3, 128, False),
                                                   (None, 1, 32, False), (1, None, None, True)):
                got = ops.sample_descent_rows(xs, t, p, mp, seed, offset, programs_per_row=programs, rounds=rounds,
                                              finish_width=finish, loop=loop)
                assert torch.equal(got, want), (t, p, mp, programs, rounds, finish, loop, got, want)
            assert want[2].item() == -1
            if isinstance(t, torch.Tensor):
                assert want[4].item() == -1
            if isinstance(p, torch.Tensor):
                assert want[5].item() == -1
        with pytest.raises(ValueError, match="rounds must be from 1 to 8"):
            ops.sample_descent_rows(xs, 1.0, 0.9, rounds=0)
        with pytest.raises(ValueError, match="finish_width must be 0 or a power of two, got 48"):
            ops.sample_descent_rows(xs, 1.0, 0.9, finish_width=48)
        if backend.INTERPRETED:
            with pytest.raises(ValueError, match="loop=True with 3 programs per row"):
                ops.sample_descent_rows(xs, 1.0, 0.9, programs_per_row=3, loop=True)
        with pytest.raises(ValueError, match="sample_descent_rows: x must be"):
            ops.sample_descent_rows(xs[:, ::2], 1.0, 0.9)
        assert ops.sample_descent_rows(xs[:0], 1.0, 0.9).shape == (0,)
    finally:
        ops.plan.cache_clear()


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_sampling_under_min_p_by_one_race_gives_the_pipelines_tokens(device, poison_allocations, monkeypatch):
    """``sample_min_p_rows`` (the segment maxima, then one race over the tokens min-p keeps) picks
    the token the pipeline picks (``sample_rows``), alone and where the pipeline also carries a
    per-row top-p of 1 (a batch whose other requests ask for top-p): min_p scalar (0.05, 0.3;
    0, which keeps every token; 1, which keeps the row's maxima) and per row with invalid values
    (1.5, -0.1, NaN: -1), and a subnormal one (1e-40: nothing skipped); a scalar temperature of 0
    (no noise), scalar and per-row temperatures (one greedy, one invalid: -1), seeds
    and offsets as ints and tensors; NaN and +-inf (never drawn), a row without a finite logit
    (-1), ties (whole numbers, and bfloat16); float16; logits spread over thousands of nats with
    min_p = 1e-30 (a row with tokens 60 to 80 nats below its maximum, across ln(1e-30) = -69);
    tokens within a few ulps of the boundary, each alone in its segment; several splits among
    programs, prefetch on and off. Segments of 64 tokens, so that most segments of a row keep no
    token (the race skips them)."""
    monkeypatch.setattr(ops, "MAX_WIDTH", 64)
    ops.plan.cache_clear()
    x = mixed_rows(23)
    xs = x.to(device)
    xs_16 = xs.to(torch.bfloat16)
    seeds = torch.tensor([5, 11, 2, 9, 31, 7], device=device)
    offsets = torch.tensor([0, 3, 1, 4, 1, 5], device=device)
    temps = torch.tensor([0.7, 0.0, 1.3, 0.5, -1.0, 2.0], device=device)  # row 1 greedy (ties), row 4 invalid
    mps = torch.tensor([0.5, 0.3, 0.5, 1.5, 0.02, float("nan")], device=device)  # rows 3 and 5 invalid
    mps_low = torch.tensor([0.0, 0.01, 0.2, -0.1, 1.0, 0.6], device=device)  # row 3 invalid
    configs = ((1.0, 0.05, 3, 0), (0.7, 0.3, seeds, offsets), (temps, 0.05, 17, offsets), (2.0, mps, 5, 1),
               (1.0, mps_low, seeds, 2), (1.0, 0.0, 4, 4), (0.8, 1.0, seeds, 3), (temps, mps, seeds, offsets),
               (0.0, 0.3, 3, 0), (1.0, 1e-40, 6, 2))
    wants = [ops.sample_rows(xs, t, None, None, mp, seed, offset) for t, mp, seed, offset in configs]
    ones = torch.ones(6, device=device)
    mixed = [ops.sample_rows(xs, t, None, ones, mp, seed, offset) for t, mp, seed, offset in configs[:3]]
    want_16 = ops.sample_rows(xs_16, temps, None, None, mps_low, seeds, offsets)
    # gaps of thousands of nats (most segments skipped, the rest near the margin's scale of the
    # float32 differences) under a min_p of 1e-30 (ln: -69 nats), and float16 logits
    wide = (xs * 700.0).to(device)
    wide[4, 100:140] = wide[4, 100:140].max() - torch.linspace(60.0, 80.0, 40)
    want_wide = ops.sample_rows(wide, 1.0, None, None, 1e-30, seeds, 6)
    want_f16 = ops.sample_rows(xs.half(), 0.9, None, None, 0.2, 8, 1)
    # tokens within a few float32 ulps of min-p's boundary, each alone in its segment of 64 (the
    # rest of the row 50 nats down): a segment skipped though it holds a kept token changes draws
    edge_mps = torch.tensor([0.5, 0.3], device=device)
    edge = torch.full((2, 300), -40.0)
    edge[:, 5] = 10.0
    for r, mp in enumerate((0.5, 0.3)):
        for col, delta in zip((70, 140, 200, 260, 290), (3e-6, -3e-6, 1e-6, 0.0, -0.01)):
            edge[r, col] = 10.0 + math.log(mp) + delta
    edge = edge.to(device)
    want_edge = [ops.sample_rows(edge, 1.0, None, None, edge_mps, 3, offset) for offset in range(12)]
    assert any(w[0].item() != 5 for w in want_edge) and any(w[1].item() != 5 for w in want_edge)
    poison_allocations()
    try:
        assert torch.equal(ops.sample_min_p_rows(xs_16, temps, mps_low, seeds, offsets), want_16)
        assert torch.equal(ops.sample_min_p_rows(wide, 1.0, 1e-30, seeds, 6), want_wide)
        assert torch.equal(ops.sample_min_p_rows(xs.half(), 0.9, 0.2, 8, 1), want_f16)
        for offset, want in enumerate(want_edge):
            assert torch.equal(ops.sample_min_p_rows(edge, 1.0, edge_mps, 3, offset), want), offset
        for (t, mp, seed, offset), want in zip(configs, wants):
            for programs, prefetch in ((None, None), (1, False), (3, True), (2, False)):
                got = ops.sample_min_p_rows(xs, t, mp, seed, offset, programs_per_row=programs, prefetch=prefetch)
                assert torch.equal(got, want), (t, mp, programs, prefetch, got, want)
            assert want[2].item() == -1
            if isinstance(t, torch.Tensor):
                assert want[4].item() == -1
            if mp is mps:
                assert want[3].item() == -1 and want[5].item() == -1
            if mp is mps_low:
                assert want[3].item() == -1
        for want, got in zip(wants, mixed):
            assert torch.equal(got, want)
        # min_p = 1 keeps a row's maxima alone: row 1 (whole numbers) ties there
        top = xs[1].max()
        assert xs[1, wants[6][1]].item() == top.item()
        with pytest.raises(ValueError, match="sample_min_p_rows: x must be"):
            ops.sample_min_p_rows(xs[:, ::2], 1.0, 0.1)
        assert ops.sample_min_p_rows(xs[:0], 1.0, 0.1).shape == (0,)
    finally:
        ops.plan.cache_clear()


def test_min_p_alone_takes_one_race(monkeypatch):
    # which calls ``sample`` sends to ``sample_min_p_rows`` (the tokens are the pipeline's): min-p
    # without top-k or top-p, on every device, unless one race over the row serves the call
    serves = ops._min_p_race_serves
    assert serves(1.0, None, None, 0.05) and serves(0.7, None, None, torch.full((2,), 0.1))
    assert serves(torch.ones(2), None, None, 0.0)
    assert serves(torch.zeros(2), None, None, 0.05)  # greedy per row: min-p's race is its argmax
    assert not serves(0.0, None, None, 0.05)  # greedy under a scalar filter: the one race over the row
    assert not serves(1.0, 50, None, 0.05) and not serves(1.0, None, 0.9, 0.05)
    assert not serves(1.0, None, None, None)


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_sampling_by_descent_from_the_pre_list_gives_the_pipelines_tokens(device, poison_allocations, monkeypatch):
    """``sample_descent_rows(listed=True)`` (the segment maxima and the histogram pass with its
    pre-list first; rows whose pre-list holds the kept prefix descend in the list) picks the
    token the pipeline picks: top-p 0.9, 0.5 and 0.02 (many steps, most in the finishing loop
    over the list), min-p alone and with top-p, per-row p with an invalid one (-1), scalar and
    per-row temperatures (one greedy, one invalid); NaN and +-inf, a row without a finite logit
    (-1), ties (rows of whole numbers), a flat row whose list gives up (it descends in its row);
    bfloat16; 1 and 3 rounds, one and three programs per row; the finishing program's passes
    in segments of 64 (the rounds') and 128 as well as the default; the rounds in one launch
    (``loop``, one program per row), with round 0 in it too (``race_in_loop``) and the list's
    first segment held through it (``hold_share``). Both kinds of row are checked to occur.
    Segments of 64 tokens."""
    monkeypatch.setattr(ops, "MAX_WIDTH", 64)
    ops.plan.cache_clear()
    g = torch.Generator().manual_seed(41)
    x = torch.randn(6, 2000, generator=g) * 5  # about 8% of a row within 10 nats of its maximum
    x[0, 7] = float("nan")
    x[0, 8] = float("inf")
    x[0, 9] = float("-inf")
    x[1] = torch.round(x[1])
    x[2, :] = float("-inf")
    x[3] = x[3] * 0.02  # flat: the list gives up
    x[4, 30:] = float("nan")
    xs = x.to(device)
    seeds = torch.tensor([5, 11, 2, 9, 31, 7], device=device)
    offsets = torch.tensor([0, 3, 1, 4, 1, 5], device=device)
    temps = torch.tensor([0.7, 0.0, 1.3, 0.5, -1.0, 2.0], device=device)  # row 1 greedy, row 4 invalid: -1
    ps = torch.tensor([0.9, 0.5, 0.9, 0.3, 0.8, 1.5], device=device)  # row 5 invalid: -1
    configs = ((1.0, 0.9, None, 3, 0), (temps, 0.5, None, seeds, offsets), (1.0, 0.02, None, 3, 2),
               (0.8, ps, 0.05, seeds, offsets), (1.0, None, 0.1, seeds, 2))
    wants = [ops.sample_rows(xs, t, None, p, mp, seed, offset) for t, p, mp, seed, offset in configs]
    xs_16 = xs.to(torch.bfloat16)
    want_16 = ops.sample_rows(xs_16, 1.0, None, 0.9, None, seeds, offsets)
    listed_rows = []
    buffer = ops._Run.buffer

    def keep_list_rows(self, name, shape, dtype, dev):
        t = buffer(self, name, shape, dtype, dev)
        if name == "list_rows":
            listed_rows.append(t)
        return t

    monkeypatch.setattr(ops._Run, "buffer", keep_list_rows)
    poison_allocations()
    try:
        assert torch.equal(ops.sample_descent_rows(xs_16, 1.0, 0.9, None, seeds, offsets, listed=True), want_16)
        for (t, p, mp, seed, offset), want, launch in zip(configs, wants, (
                dict(), dict(rounds=1, finish_width=0, loop=False), dict(rounds=3, programs_per_row=3, loop=False),
                dict(programs_per_row=1, descent_programs_per_row=1, loop=True),
                dict(rounds=1, finish_width=128, loop=False))):
            got = ops.sample_descent_rows(xs, t, p, mp, seed, offset, listed=True, **launch)
            assert torch.equal(got, want), (t, p, mp, launch, got, want)
            assert want[2].item() == -1
        # round 0 in the loop's launch (``race_in_loop``), and with the first segment of the list
        # held through the loop (``hold_share``: one program per row holds the first of its
        # segments and loads the rest in each pass)
        in_loop = dict(programs_per_row=1, descent_programs_per_row=1, loop=True, race_in_loop=True,
                       hold_share=False)
        held = dict(in_loop, hold_share=True)
        for i, ((t, p, mp, seed, offset), want) in enumerate(zip(configs, wants)):
            launch = held if i % 2 else in_loop
            got = ops.sample_descent_rows(xs, t, p, mp, seed, offset, listed=True, **launch)
            assert torch.equal(got, want), (t, p, mp, launch, got, want)
        assert torch.equal(ops.sample_descent_rows(xs_16, 1.0, 0.9, None, seeds, offsets, listed=True, **held),
                           want_16)
        with pytest.raises(ValueError, match="race_in_loop=True needs the listed descent's loop"):
            ops.sample_descent_rows(xs, 1.0, 0.9, listed=True, loop=False, race_in_loop=True)
        with pytest.raises(ValueError, match="hold_share=True needs round 0 in the loop"):
            ops.sample_descent_rows(xs, 1.0, 0.9, listed=True, **dict(held, race_in_loop=False))
        with pytest.raises(ValueError, match="max_registers must be None or an int"):
            ops.sample_descent_rows(xs, 1.0, 0.9, listed=True, **dict(held, max_registers=300))
        with pytest.raises(ValueError, match="max_registers caps the loop's launch"):
            ops.sample_descent_rows(xs, 1.0, 0.9, listed=True, loop=False, max_registers=128)
        assert wants[1][4].item() == -1 and wants[3][5].item() == -1
        # (row 3 is flat; row 0 descends in its list under every filter)
        assert all(rows[3].item() == 0 and rows[0].item() == 1 for rows in listed_rows), listed_rows
    finally:
        ops.plan.cache_clear()


def test_descent_loops_where_a_rows_programs_fit_at_once(monkeypatch):
    # the rounds in one launch by default from the pre-list, and over the row where the whole
    # launch fits DESCENT_LOOP_PROGRAMS_PER_SM per SM; asked for, wherever a row's programs can be
    # resident at once (8 // num_warps per SM at any register count), else a ValueError
    monkeypatch.setattr(backend, "INTERPRETED", False)
    monkeypatch.setattr(ops, "_sm_count", lambda device: 132)
    monkeypatch.setattr(ops, "DESCENT_LOOP_PROGRAMS_PER_SM", 3)
    dev = torch.device("cuda")

    def plan(programs_per_row, num_warps=4):
        return ops.Plan(1024, 1, programs_per_row, 256, num_warps, False)

    loops = ops._descent_loops
    assert loops(None, 1, plan(149), False, dev) and loops(None, 2, plan(149), False, dev)  # 298 <= 396
    assert not loops(None, 3, plan(149), False, dev)  # 447 programs: the launches
    assert loops(None, 64, plan(8), True, dev)  # from the pre-list: idle programs return at once
    assert not loops(False, 1, plan(149), False, dev) and loops(True, 3, plan(149), False, dev)
    assert loops(True, 1, plan(264), False, dev) and loops(True, 1, plan(132, 8), False, dev)
    for per_row, warps in ((265, 4), (133, 8)):
        with pytest.raises(ValueError, match=f"loop=True with {per_row} programs per row.*at most {per_row - 1}"):
            loops(True, 1, plan(per_row, warps), False, dev)
    monkeypatch.setattr(ops, "DESCENT_LOOP", False)
    assert not loops(None, 1, plan(149), False, dev) and not loops(None, 64, plan(8), True, dev)
    monkeypatch.setattr(ops, "DESCENT_LOOP", True)
    monkeypatch.setattr(backend, "INTERPRETED", True)  # programs one after another
    assert loops(None, 1, plan(1), False, dev) and not loops(None, 1, plan(2), False, dev)
    with pytest.raises(ValueError, match="interpreter"):
        loops(True, 1, plan(2), False, dev)


def test_descent_serves_top_p_alone_up_to_its_rows(monkeypatch):
    # which calls ``sample`` sends to the descent on CUDA (the rule; the tokens are the same): over
    # the row up to DESCENT_MAX_ROWS, from the pre-list from DESCENT_LISTED_MIN_ROWS
    x = torch.empty(2, 100)

    class OnCuda:  # (the rule reads only whether the logits are on CUDA, and their rows)
        is_cuda = True
        shape = (ops.DESCENT_MAX_ROWS, 100)

    class ManyRowsOnCuda(OnCuda):
        shape = (ops.DESCENT_LISTED_MIN_ROWS, 100)

    class BetweenOnCuda(OnCuda):  # (past DESCENT_MAX_ROWS, short of DESCENT_LISTED_MIN_ROWS: the pipeline)
        shape = (ops.DESCENT_MAX_ROWS + 1, 100)

    serves = ops._descent_serves
    assert serves(OnCuda, 1.0, None, 0.9, None) and serves(OnCuda, 0.7, None, ops.DESCENT_MIN_TOP_P, None)
    assert serves(OnCuda, torch.ones(2), None, 0.9, None)
    assert serves(ManyRowsOnCuda, 1.0, None, 0.9, None)  # from the pre-list
    assert serves(BetweenOnCuda, 1.0, None, 0.9, None) == (ops.DESCENT_LISTED_MIN_ROWS == ops.DESCENT_MAX_ROWS + 1)
    assert not serves(ManyRowsOnCuda, 1.0, None, 0.9, 0.05)  # min-p: the pipeline
    assert not serves(x, 1.0, None, 0.9, None)  # not CUDA
    assert not serves(OnCuda, 1.0, 50, 0.9, None)  # top-k: the lanes or the pipeline
    assert not serves(OnCuda, 0.7, None, None, 0.05)  # min-p alone: its own race (sample_min_p_rows)
    assert not serves(OnCuda, 1.0, None, 0.9, 0.05) and not serves(OnCuda, 1.0, None, 0.9, torch.ones(2))
    assert not serves(OnCuda, 1.0, None, ops.DESCENT_MIN_TOP_P / 2, None)  # small p: many rounds
    assert not serves(OnCuda, 1.0, None, torch.full((2,), 0.9), None)  # p the host cannot see
    assert not serves(OnCuda, 1.0, None, None, None)  # no filter: one race
    assert not serves(OnCuda, 0.0, None, 0.9, None)  # greedy under scalar filters: one race
    monkeypatch.setattr(ops, "DESCENT_LISTED_SAMPLES", False)
    assert not serves(ManyRowsOnCuda, 1.0, None, 0.9, None)  # past a wave, the listing off: the pipeline


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_long_boundary_lists_take_the_sort_and_the_search(device, monkeypatch):
    """Short pairwise, sort and bracket-search tiers give the same answers (tiny tiers here)."""
    monkeypatch.setattr(ops, "PAIRWISE_MAX", 4)
    monkeypatch.setattr(ops, "PAIRWISE_MAX_TOP_K", 4)
    monkeypatch.setattr(ops, "PAIR_CHUNK", 2)
    monkeypatch.setattr(ops, "SORT_MAX", 16)
    monkeypatch.setattr(ops, "SEARCH_BLOCK", 8)
    g = torch.Generator().manual_seed(4)
    x = torch.randint(-2, 3, (3, 40), generator=g).float()  # ties everywhere: the index search
    x[2] = 0.5  # one value: every bin is one tie group
    xs = x.to(device)
    for k in (3, 10, 16):
        values, indices = ops.top_k_rows(xs, k)
        want_v, want_i = ref.top_k(x, k)
        assert torch.equal(indices.cpu(), want_i) and torch.equal(values.cpu(), want_v), k
    seeds = torch.tensor([5, 6, 7])
    # sampling and thresholds: lists past the pairwise tier sorted when short enough, or searched
    configs = (dict(top_k=7), dict(top_p=0.55), dict(top_k=30, top_p=0.7, min_p=0.2))
    for sort_mid, config in ((s, c) for s in (False, True) for c in configs):
        monkeypatch.setattr(ops, "SORT_MID_LISTS", sort_mid)
        got = ops.sample_rows(xs, 1.0, config.get("top_k"), config.get("top_p"),
                              config.get("min_p"), seeds.to(device), 2)
        want = ref.sample(x, 1.0, config.get("top_k"), config.get("top_p"), config.get("min_p"),
                          seeds, 2)
        assert torch.equal(got.cpu(), want), (sort_mid, config)
        masked = ops.filter_rows(xs, config.get("top_k"), config.get("top_p"), config.get("min_p"))
        want_mask = ref.filter_mask(x, config.get("top_k"), config.get("top_p"), config.get("min_p"))
        assert torch.equal(torch.isfinite(masked.cpu()), torch.isfinite(want_mask)), (sort_mid, config)


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_every_pairwise_tier_ranks_as_the_reference(device, monkeypatch):
    """Boundary lists of every length up to the pairwise limit, ranked on one chunk's tile or on
    the limit's with the chunks past the list's end skipped, give the reference's answers (tiny
    tiers here: chunks of 2, a limit of 8 for top_k and 16-bit logits)."""
    monkeypatch.setattr(ops, "PAIRWISE_MAX_TOP_K", 8)
    monkeypatch.setattr(ops, "PAIRWISE_MAX_16BIT", 8)
    monkeypatch.setattr(ops, "PAIR_CHUNK", 2)
    g = torch.Generator().manual_seed(6)
    x = torch.randint(-3, 4, (3, 48), generator=g).to(torch.bfloat16)  # tie groups of every size
    x[2] = (torch.randn(48, generator=g) * 2).to(torch.bfloat16)
    xs = x.to(device)
    for k in range(1, 13):
        values, indices = ops.top_k_rows(xs, k)
        want_v, want_i = ref.top_k(x, k)
        assert torch.equal(indices.cpu(), want_i) and torch.equal(values.cpu(), want_v), k
    seeds = torch.tensor([5, 6, 7])
    for config in (dict(top_p=0.2), dict(top_p=0.5), dict(top_p=0.8), dict(top_k=5, top_p=0.9),
                   dict(min_p=0.3)):
        args = (config.get("top_k"), config.get("top_p"), config.get("min_p"))
        got = ops.sample_rows(xs, 1.0, *args, seeds.to(device), 2)
        assert torch.equal(got.cpu(), ref.sample(x, 1.0, *args, seeds, 2)), config
        masked = ops.filter_rows(xs, *args)
        assert torch.equal(torch.isfinite(masked.cpu()), torch.isfinite(ref.filter_mask(x, *args))), config


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_flat_rows_shorten_long_lists_with_sub_bins(device, monkeypatch):
    """A flat row puts hundreds of tokens in the boundary bins: the sub-bin histogram cuts the
    list down before the ranking (a tiny pairwise tier here forces that path), in blocks of 64
    or of 8 (dozens of blocks: the pass keeps the next two in flight)."""
    monkeypatch.setattr(ops, "PAIRWISE_MAX", 8)
    monkeypatch.setattr(ops, "PAIR_CHUNK", 4)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 300, generator=g) * 0.4
    xs = x.to(device)
    seeds = torch.tensor([5, 6, 7])
    for block, config in ((b, c) for b in (64, 8) for c in (dict(top_p=0.9), dict(top_k=150, top_p=0.8),
                                                            dict(top_k=200, min_p=0.5))):
        monkeypatch.setattr(ops, "SEARCH_BLOCK", block)
        args = (config.get("top_k"), config.get("top_p"), config.get("min_p"))
        got = ops.sample_rows(xs, 1.0, *args, seeds.to(device), 2)
        assert torch.equal(got.cpu(), ref.sample(x, 1.0, *args, seeds, 2)), config
        probs = ops.filter_rows(xs, *args, probs=True).cpu()
        want = ref.filter_mask(x, *args, probs=True)
        assert torch.equal(probs > 0, want > 0), config
        torch.testing.assert_close(probs, want, rtol=2e-6, atol=1e-8)


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_tiny_top_p_keeps_the_top_token(device):
    """p * M below one fixed-point unit (2^-40 of the top token's weight) still keeps the first
    token: nothing comes before it."""
    x = torch.tensor([[0.2, 1.0, 0.5, 0.0] * 10, [3.0, -1.0, 3.0, 2.0] * 10], device=device)
    for p in (1e-15, 1e-30, 1.5e-38):
        assert torch.equal(treefold.sample(x, top_p=p, seed=1).cpu(), torch.tensor([1, 0])), p
        probs = treefold.top_p_mask(x, p, probs=True).cpu()
        want = torch.zeros_like(probs)
        want[0, 1] = want[1, 0] = 1.0
        assert torch.equal(probs, want), p


def test_only_top_p_and_the_masks_sum_masses():
    """Which calls take fixed-point weights (``_needs_masses``): every mask call, and sampling where
    some row can have top-p on; not top-k or min-p sampling alone, nor ``top_k``."""
    sample, topk, threshold = (kernels.MODE_SAMPLE.value, kernels.MODE_TOPK.value, kernels.MODE_THRESHOLD.value)
    assert ops._needs_masses(sample, 0.9) and ops._needs_masses(sample, torch.tensor([1.0, 1.0]))
    assert ops._needs_masses(threshold, None) and ops._needs_masses(threshold, 1.0)
    assert not ops._needs_masses(sample, None) and not ops._needs_masses(sample, 1.0)
    assert not ops._needs_masses(topk, None)


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_calls_without_top_p_give_the_same_results_without_masses(device, monkeypatch):
    """Top-k and min-p sampling and ``top_k`` skip the fixed-point weights (``MASSES`` off in the
    histogram and the compaction): nothing they decide reads a mass, so summing the masses anyway
    changes no result. Whole rows and pre-lists (10 programs per row: a pre-list on this grid)."""
    g = torch.Generator().manual_seed(21)
    x = (torch.randn(3, 300, generator=g) * torch.tensor([[0.4], [2.0], [4.0]])).to(device)
    seeds = torch.tensor([5, 6, 7], device=device)
    configs = ((20, None, None), (None, None, 0.05), (20, None, 0.05), (1, None, None))
    assert not any(ops._needs_masses(kernels.MODE_SAMPLE.value, c[1]) for c in configs)

    def results():
        out = []
        for ppr in (None, 10):
            out += [ops.sample_rows(x, 0.8, *c, seeds, 3, programs_per_row=ppr) for c in configs]
            out += list(ops.top_k_rows(x, 40, programs_per_row=ppr))
        return out

    lean = results()
    monkeypatch.setattr(ops, "_needs_masses", lambda mode, top_p: True)
    for got, want in zip(results(), lean):
        assert torch.equal(got, want)


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_every_output_and_buffer_is_written_before_it_is_read(device, poison_allocations):
    """Tokens, top_k's outputs, masks and every scratch buffer (histograms, list counters,
    partials) start as NaN or a sentinel: the kernels clear or write each before reading it, so
    the results equal those of clean buffers."""
    g = torch.Generator().manual_seed(12)
    x = (torch.randn(3, 300, generator=g) * torch.tensor([[0.4], [2.0], [4.0]])).to(device)
    seeds = torch.tensor([5, 6, 7], device=device)

    def results():
        out = [ops.sample_rows(x, 0.8, *c, seeds, 3) for c in
               ((None, 0.9, None), (20, 0.8, None), (None, None, 0.05), (None, None, None))]
        out.append(ops.sample_rows(x, 0.0, None, None, None, seeds, 3))
        out.extend(ops.top_k_rows(x, 40))
        out.append(ops.filter_rows(x, None, 0.9, None, probs=True))
        out.append(ops.filter_rows(x, 20, None, 0.05, probs=False))
        return out

    clean = results()
    poison_allocations()
    for got, want in zip(results(), clean):
        assert torch.equal(got, want)


def test_race_plans_by_dtype_and_noise():
    """The unfiltered race's launch rule (``race_plan``): 16 programs per SM, 8 for float32
    greedy, 16-bit logits without prefetch; what a caller asks for is used as given. For a CPU
    device the plan counts 4 SMs: one row of 151936 (149 segments of 1024) aims at 32 or 64
    programs and gets 30 of 5 segments or 50 of 3."""
    cpu = torch.device("cpu")

    def race(dtype, greedy, **kw):
        g = ops.race_plan(1, 151936, dtype, cpu, greedy, **kw)
        return g.segments_per_program, g.programs_per_row, g.prefetch

    assert race(torch.float32, True) == (5, 30, True)  # 8 per SM: 32 programs aimed at
    assert race(torch.float32, False) == (3, 50, True)  # 16 per SM
    assert race(torch.bfloat16, True) == race(torch.float16, False) == (3, 50, False)
    assert race(torch.bfloat16, True, prefetch=True) == (3, 50, True)
    assert race(torch.float32, True, programs_per_row=149, prefetch=False) == (1, 149, False)


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_segment_width_and_programs_never_change_a_result(device, monkeypatch):
    """Segment width, programs per row and where the sure-kept tokens race are launch choices:
    every partial result is exact (maxima, races, integer counts, fixed-point masses) and the
    lists are never read in arrival order. 32-token segments against the default (512 here), on
    1, 3 and all programs per row; every sure-kept token raced in place (by the compaction launch's
    race programs, or inside its compaction programs), listed, or each row deciding by its own count."""
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(3, 300, generator=g) * torch.tensor([[0.4], [2.0], [4.0]])).to(device)
    seeds = torch.tensor([5, 6, 7], device=device)
    configs = (dict(), dict(top_p=0.9), dict(top_k=20, top_p=0.8), dict(min_p=0.05))

    def outputs(programs_per_row=None, prefetch=None):
        launch = dict(programs_per_row=programs_per_row, prefetch=prefetch)
        out = []
        for c in configs:
            args = (c.get("top_k"), c.get("top_p"), c.get("min_p"))
            out.append(ops.sample_rows(x, 0.8, *args, seeds, 3, **launch))
            if c:
                out.append(ops.filter_rows(x, *args, probs=True, **launch))
        out.append(ops.sample_rows(x, 0.0, None, None, None, seeds, 3, **launch))  # greedy: the race alone
        out.extend(ops.top_k_rows(x, 40, **launch))
        return out

    ops.plan.cache_clear()
    want = outputs()
    # sure-kept tokens all raced in place, listed by the rows that have few of them
    # (20: the flat row races, the peaked rows list), or all listed for the resolve pass; the
    # in-place race by race programs of the compaction launch, or inside its compaction programs
    for sure_list_max in (0, 20, 1 << 20):
        for race_per_sm in (0, 1 << 20):
            monkeypatch.setattr(ops, "SURE_LIST_MAX", sure_list_max)
            monkeypatch.setattr(ops, "SURE_LIST_MAX_IN_COMPACTION", sure_list_max)
            monkeypatch.setattr(ops, "COMPACT_RACE_PROGRAMS_PER_SM", race_per_sm)
            assert all(torch.equal(a, b) for a, b in zip(outputs(), want)), (sure_list_max, race_per_sm)
    try:
        monkeypatch.setattr(ops, "MAX_WIDTH", 32)
        ops.plan.cache_clear()
        for ppr in (1, 3, 10):
            for prefetch in (False, True):  # segments loaded one step ahead, or not
                got = outputs(ppr, prefetch)
                assert all(torch.equal(a, b) for a, b in zip(got, want)), (ppr, prefetch)
    finally:
        monkeypatch.undo()
        ops.plan.cache_clear()


class _RecordingRun(ops._Run):
    """A run of launches that keeps its buffers, to read what the passes decided, and a copy of
    them as the compaction left them (``compacted``): the resolve pass rewrites the boundary list
    in place, and what it leaves behind depends on the order the list was filled in."""

    def __init__(self):
        super().__init__()
        self.buffers = {}
        self.compacted = {}
        self.counted = False  # whether the count pass ran (a pre-list call)

    def buffer(self, name, shape, dtype, device):
        self.buffers[name] = super().buffer(name, shape, dtype, device)
        return self.buffers[name]

    def __call__(self, launcher, grid, *args, **kwargs):
        super().__call__(launcher, grid, *args, **kwargs)
        self.counted |= launcher is ops._COUNT
        if launcher is ops._COMPACT:
            self.compacted = {name: t.cpu().clone() for name, t in self.buffers.items()}


class _PoisonOffTheListRun(_RecordingRun):
    """Before the compaction launch, every logit of ``rows`` that is not on the row's pre-list
    becomes the row's largest finite logit. A compaction that reads such a row instead of its
    pre-list counts those tokens in bin 0 and the call's result changes; one that reads the
    pre-list does not see them (the resolve pass reads only listed tokens)."""

    def __init__(self, x, rows):
        super().__init__()
        self.x, self.rows = x, rows

    def __call__(self, launcher, grid, *args, **kwargs):
        if launcher is ops._COMPACT:
            count, listed = self.buffers["prelist_count"].cpu(), self.buffers["prelist"].cpu()
            for r in self.rows:
                assert count[r] <= listed.shape[1], f"row {r}: its pre-list is incomplete"
                off = torch.ones(self.x.shape[1], dtype=torch.bool)
                off[listed[r, :count[r]].long()] = False
                row = self.x[r]
                row[off.to(row.device)] = row[torch.isfinite(row)].max()
        super().__call__(launcher, grid, *args, **kwargs)


def _filtered_pipeline(x, mode, config, run, programs_per_row=None):
    """One filtered-path call straight through ``_pipeline`` with ``run``: sampling (tokens),
    threshold (the resolve pass's lo, hi, threshold, maximum and mass, before any mask is
    applied) or top_k (values and indices). Returns its outputs."""
    rows, dev = x.shape[0], x.device
    top_k, top_p, min_p = config.get("top_k"), config.get("top_p"), config.get("min_p")
    if mode == "sample":
        outputs = {"token": torch.empty(rows, dtype=torch.int64, device=dev)}
        ops._pipeline(x, kernels.MODE_SAMPLE.value, config.get("temperature", 1.0), top_k, top_p, min_p,
                      torch.arange(rows, device=dev) + 5, 3, all_values=False, outputs=outputs, k_out=0,
                      programs_per_row=programs_per_row, run=run)
    elif mode == "threshold":
        outputs = {name: torch.empty(rows, dtype=dtype, device=dev) for name, dtype in (
            ("lo", torch.int32), ("hi", torch.int32), ("thr", torch.int64), ("max", torch.float32),
            ("mass", torch.float32))}
        ops._pipeline(x, kernels.MODE_THRESHOLD.value, 1.0, top_k, top_p, min_p, 0, 0, all_values=False,
                      outputs=outputs, k_out=0, programs_per_row=programs_per_row, run=run)
    else:
        outputs = {"values": torch.empty((rows, top_k), dtype=x.dtype, device=dev),
                   "indices": torch.empty((rows, top_k), dtype=torch.int64, device=dev)}
        ops._pipeline(x, kernels.MODE_TOPK.value, 1.0, top_k, None, None, 0, 0, all_values=True,
                      outputs=outputs, k_out=top_k, programs_per_row=programs_per_row, run=run)
    return [t.cpu() for t in outputs.values()]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes, dtypes and bytes (NaN equals NaN of the same bits)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _compaction_results(run, n) -> list:
    """What the compaction pass hands the resolve pass, per row, in a form that does not depend
    on the order the lists were filled in: list lengths, the sorted boundary and sure-kept
    lists, the summed fixed-point masses, the sub-bin histogram and the plan."""
    b = run.compacted
    rows = b["counter"].shape[0]
    out = []
    for r in range(rows):
        c = int(b["counter"][r])
        front, back = c & 0xFFFFFFFF, c >> 32
        row_list = b["boundary"][r]
        out.append((c, sorted(row_list[:front].tolist()), sorted(row_list[n - back:].tolist()),
                    int(b["part_mass"].view(rows, -1)[r].sum()), int(b["part_kept"].view(rows, -1)[r].sum()),
                    b["fine"][r].tolist(), b["plan"][r].tolist()))
    return out


def _assert_same_results(mode, whole, listed, why):
    """Two filtered-path calls on the same data, one of them counting some rows' bins from their
    pre-lists (``bin_count_kernel``), give the same results. Tokens and top_k's values and
    indices are equal. A list-counted row knows the exact mass past its list and may narrow the
    thresholds' bins [lo, hi] inside those of whole-row counts; the threshold key, which is
    taken inside [lo, hi], is then compared where the bins agree, and the masks the thresholds
    make are compared by the callers. The maximum and the kept mass are equal."""
    if mode != "threshold":
        assert all(map(_same_bits, whole, listed)), why
        return
    (lo_a, hi_a, thr_a, max_a, mass_a), (lo_b, hi_b, thr_b, max_b, mass_b) = whole, listed
    assert _same_bits(max_a, max_b) and _same_bits(mass_a, mass_b), why
    same_bins = (lo_a == lo_b) & (hi_a == hi_b)
    assert torch.equal(thr_a[same_bins], thr_b[same_bins]), why


def _assert_same_compaction(whole, listed, n, why):
    """What the compaction hands on is the same for every row whose plan is the same. A row whose
    plan differs was counted from its pre-list in ``listed`` and, where ``whole`` counted it from
    its logits, has its bins [lo, hi] inside the whole-row ones (exact mass past the list: bounds
    never wider)."""
    a, b = _compaction_results(whole, n), _compaction_results(listed, n)
    from_list = listed.buffers["list_rows"].cpu().tolist()
    whole_rows = whole.buffers["list_rows"].cpu().tolist() if whole.counted else [0] * len(a)
    lo, hi = kernels.PLAN_LO.value, kernels.PLAN_HI.value
    for r, (ra, rb) in enumerate(zip(a, b)):
        if ra[-1] == rb[-1]:
            assert ra == rb, (why, r)
        else:
            assert from_list[r] == 1, (why, r, ra[-1], rb[-1])
            if whole_rows[r] == 0:
                assert ra[-1][lo] <= rb[-1][lo] and rb[-1][hi] <= ra[-1][hi], (why, r, ra[-1], rb[-1])


#: Calls of every mode whose boundary lies within 10 nats of the maximum in peaked rows.
PRE_LIST_CASES = (("sample", dict(top_p=0.9, temperature=0.8)), ("sample", dict(top_k=10, top_p=0.8)),
                  ("sample", dict(min_p=0.05, temperature=0.8)), ("threshold", dict(top_p=0.75)),
                  ("threshold", dict(min_p=0.1)), ("top_k", dict(top_k=10)))


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_sure_kept_race_over_many_blocks_gives_the_reference(device, monkeypatch):
    """The resolve pass races a listed sure-kept set block by block (its first block loaded
    before the row's partials), the blocks meeting lane by lane: with blocks of 8 and sure-kept
    sets of hundreds, tied maxima in several blocks and lanes (a zero temperature: the race is a
    greedy pick, the lowest index wins) and noisy races give the reference's tokens."""
    monkeypatch.setattr(ops, "SEARCH_BLOCK", 8)
    monkeypatch.setattr(ops, "SURE_LIST_MAX", 1 << 20)  # every row lists its sure-kept tokens
    monkeypatch.setattr(ops, "SURE_LIST_MAX_IN_COMPACTION", 1 << 20)
    g = torch.Generator().manual_seed(17)
    x = torch.randn(3, 300, generator=g) * torch.tensor([[0.3], [1.0], [2.0]])
    x[0, 290] = x[0, 9] = x[0, 150] = 1.5  # tied maxima far apart in the list
    x[1, 77] = x[1, 3] = 4.0
    seeds = torch.tensor([5, 6, 7])
    xs = x.to(device)
    ops.plan.cache_clear()
    try:
        for temperature in (torch.zeros(3), 0.8):
            for config in (dict(top_p=0.99), dict(min_p=0.01), dict(top_p=0.9, min_p=0.05)):
                args = (None, config.get("top_p"), config.get("min_p"))
                t = temperature.to(device) if isinstance(temperature, torch.Tensor) else temperature
                got = ops.sample_rows(xs, t, *args, seeds.to(device), 2, programs_per_row=3)
                want = ref.sample(x, temperature, *args, seeds, 2)
                assert torch.equal(got.cpu(), want), (temperature, config)
                if isinstance(temperature, torch.Tensor):
                    assert got.tolist()[:2] == [9, 3]
    finally:
        monkeypatch.undo()
        ops.plan.cache_clear()


@pytest.mark.skipif(not KERNEL or torch.cuda.is_available(), reason="the interpreter stands in for the GPU here")
def test_fused_reductions_give_what_separate_ones_give(monkeypatch):
    """Compiled, a race's (score, index) winner and the resolve pass's partials are each one
    multi-operand ``tl.reduce``; interpreted, separate reductions (``FUSED_REDUCTIONS``). The
    compiled form, run here through the interpreter, gives every output the separate form gives:
    sampling (greedy, plain, every filter; sure-kept tokens listed, raced by race programs or
    inside the compaction's), the masks (thresholds) and top_k."""
    g = torch.Generator().manual_seed(21)
    x = torch.randn(3, 300, generator=g) * torch.tensor([[0.4], [2.0], [4.0]])
    # greedy rows with tied maxima: inside one program with the higher index in a lower lane
    # (33 in lane 1, 2 in lane 2), across programs, and both
    ties = torch.randn(3, 300, generator=g) * 0.4
    ties[0, 2] = ties[0, 33] = ties[1, 5] = ties[1, 260] = ties[2, 40] = ties[2, 7] = ties[2, 290] = 2.0
    seeds = torch.tensor([5, 6, 7])
    # top-p 0.99 with min-p 0.1: min-p drops sure-kept tokens, so the two sure-kept masses differ
    configs = (dict(top_p=0.9), dict(top_k=20, top_p=0.8), dict(min_p=0.05), dict(top_p=0.99, min_p=0.1))
    # the fused form is slow interpreted: short blocks; 32-token segments, so that every pass has
    # partials to merge (10 segments per row on 3 programs)
    monkeypatch.setattr(ops, "SEARCH_BLOCK", 128)
    monkeypatch.setattr(ops, "MAX_WIDTH", 32)
    launch = dict(programs_per_row=3)

    def greedy_ties():
        # greedy through the race alone, and through the filtered path (a zero temperature per
        # row: no noise), its sure-kept tokens listed or raced in place
        out = [ops.sample_rows(ties, 0.0, None, None, None, seeds, 3, **launch),
               ops.sample_rows(ties, torch.zeros(3), None, 0.99, None, seeds, 3, **launch)]
        defaults = ops.SURE_LIST_MAX, ops.COMPACT_RACE_PROGRAMS_PER_SM, ops.SURE_LIST_MAX_IN_COMPACTION
        for race_per_sm in (0, 1 << 20):
            monkeypatch.setattr(ops, "SURE_LIST_MAX", 0)
            monkeypatch.setattr(ops, "SURE_LIST_MAX_IN_COMPACTION", 0)
            monkeypatch.setattr(ops, "COMPACT_RACE_PROGRAMS_PER_SM", race_per_sm)
            out.append(ops.sample_rows(ties, torch.zeros(3), None, 0.99, None, seeds, 3, **launch))
        monkeypatch.setattr(ops, "SURE_LIST_MAX", defaults[0])
        monkeypatch.setattr(ops, "COMPACT_RACE_PROGRAMS_PER_SM", defaults[1])
        monkeypatch.setattr(ops, "SURE_LIST_MAX_IN_COMPACTION", defaults[2])
        return out

    # boundary lists longer than PAIRWISE_MAX: near-flat rows, which the sub-bin pass shortens
    # (``_refine``), and a tie group it cannot, which the bracket search resolves
    long_lists = (torch.randn(2, 600, generator=g) * 0.05, torch.zeros(2, 600))

    def outputs():
        out = greedy_ties()
        out += [ops.sample_rows(x, t, None, None, None, seeds, 3, **launch) for t in (0.0, 0.8)]
        for rows in long_lists:
            out.append(ops.sample_rows(rows, 0.8, None, 0.9, None, seeds[:2], 3, **launch))
            out.append(ops.sample_rows(rows, 0.8, 20, 0.5, None, seeds[:2], 3, **launch))
            out.append(ops.filter_rows(rows, None, 0.9, None, probs=True, **launch))
            out.append(ops.filter_rows(rows, 20, 0.5, 0.1, probs=True, **launch))
        for c in configs:
            args = (c.get("top_k"), c.get("top_p"), c.get("min_p"))
            out.append(ops.sample_rows(x, 0.8, *args, seeds, 3, **launch))
            out.append(ops.filter_rows(x, *args, probs=True, **launch))
        out.extend(ops.top_k_rows(x, 40, **launch))
        defaults = ops.SURE_LIST_MAX, ops.COMPACT_RACE_PROGRAMS_PER_SM, ops.SURE_LIST_MAX_IN_COMPACTION
        for race_per_sm in (0, 1 << 20):  # every sure-kept token raced: by race programs, inside the compaction's
            monkeypatch.setattr(ops, "SURE_LIST_MAX", 0)
            monkeypatch.setattr(ops, "SURE_LIST_MAX_IN_COMPACTION", 0)
            monkeypatch.setattr(ops, "COMPACT_RACE_PROGRAMS_PER_SM", race_per_sm)
            out.append(ops.sample_rows(x, 0.8, None, 0.95, None, seeds, 4, **launch))
        monkeypatch.setattr(ops, "SURE_LIST_MAX", defaults[0])
        monkeypatch.setattr(ops, "COMPACT_RACE_PROGRAMS_PER_SM", defaults[1])
        monkeypatch.setattr(ops, "SURE_LIST_MAX_IN_COMPACTION", defaults[2])
        # the descent's rounds (sums and races in one reduce) and its finishing loop (near-flat rows)
        out.append(ops.sample_descent_rows(x, 0.8, 0.9, 0.05, seeds, 3, rounds=1, loop=False, **launch))
        out.append(ops.sample_descent_rows(ties, torch.zeros(3), 0.99, None, seeds, 3, **launch))
        out.append(ops.sample_descent_rows(long_lists[0], 0.8, 0.3, None, seeds[:2], 3, rounds=1, loop=False,
                                           **launch))
        return out

    assert not kernels.FUSED_REDUCTIONS
    ops.plan.cache_clear()
    try:
        want = outputs()
        monkeypatch.setattr(kernels, "FUSED_REDUCTIONS", tl.constexpr(True))
        got = outputs()
    finally:
        monkeypatch.undo()
        ops.plan.cache_clear()
    assert len(got) == len(want)
    for tokens in got[:4]:  # the lowest index of each row's tied maximum
        assert tokens.tolist() == [2, 5, 7]
    for i, (a, b) in enumerate(zip(got, want)):
        assert _same_bits(a, b), i


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_compaction_from_the_pre_list_gives_what_the_row_gives(device, monkeypatch):
    """Peaked rows have the compaction read the histogram's pre-list (the tokens within
    PRELIST_BINS bins of the maximum) instead of the row: poisoning every logit off the list
    just before the compaction changes nothing. A flat row's pre-list overflows its capacity and
    that row reads its logits. In every mode (sampling, thresholds, top_k with NaN and
    infinities), on one program per row and on three sharing segments of 32 tokens, the call's
    results equal those of calls without a pre-list (``_assert_same_results``; the masks too),
    and what the compaction hands on (lists as sets, masses, sub-bins, plan) equals theirs for
    every row whose plan is the same (a list-counted row's bins may be narrower:
    ``_assert_same_compaction``); sampled tokens equal the reference's. By default filtered calls
    on grids of more than PRELIST_MIN_PROGRAMS_PER_SM programs per SM make the pre-list (unless no
    filter can end a row's prefix in it); here every grid does."""
    bins = ops.PRELIST_BINS
    assert ops._prelist_bins(None, 0.9, None, 1920, 132) == bins
    assert ops._prelist_bins(None, torch.tensor([1.0]), None, 1920, 132) == bins
    assert ops._prelist_bins(50, None, None, 1920, 132) == bins
    assert ops._prelist_bins(None, 1.0, 0.05, 1920, 132) == bins
    assert ops._prelist_bins(None, None, torch.tensor([0.0]), 1920, 132) == bins
    assert ops._prelist_bins(None, None, None, 1920, 132) == 0
    assert ops._prelist_bins(None, 1.0, 0.0, 1920, 132) == 0
    assert ops._prelist_bins(None, 0.9, None, 149, 132) == 0
    default = {name: getattr(ops, name) for name in ("PRELIST_BINS", "PRELIST_FRACTION", "SURE_LIST_MAX",
                                                     "COMPACT_RACE_PROGRAMS_PER_SM")}
    monkeypatch.setattr(ops, "PRELIST_MIN_PROGRAMS_PER_SM", 0)
    # what the compaction hands on is compared with and without a pre-list: the sure-kept tokens
    # listed in both (a compaction without one would otherwise race them in place on these grids)
    monkeypatch.setattr(ops, "SURE_LIST_MAX_IN_COMPACTION", ops.SURE_LIST_MAX)
    g = torch.Generator().manual_seed(21)
    n = 400
    x = torch.randn(3, n, generator=g) * torch.tensor([[6.0], [8.0], [0.3]])
    x[1, 7] = float("-inf")
    with_non_finite = x.clone()  # top_k orders every value
    with_non_finite[0, 3], with_non_finite[1, 11], with_non_finite[1, 13] = float("nan"), float("inf"), float("nan")
    for mode, config in PRE_LIST_CASES:
        data = (with_non_finite if mode == "top_k" else x).to(device)
        if mode == "sample":
            want = ref.sample(x, seed=torch.arange(3) + 5, offset=3, **config)
            assert torch.equal(_filtered_pipeline(data, mode, config, _RecordingRun())[0], want), config
        for ppr, width in ((None, ops.MAX_WIDTH), (3, 32)):
            monkeypatch.setattr(ops, "MAX_WIDTH", width)
            ops.plan.cache_clear()
            listed = _RecordingRun()
            got = _filtered_pipeline(data, mode, config, listed, ppr)
            count, stride = listed.buffers["prelist_count"].cpu(), listed.buffers["prelist"].shape[1]
            assert (count[:2] <= stride).all() and count[2] > stride, (mode, config, count, stride)
            # the peaked rows' bins are counted from their lists, the flat row's from its logits
            assert listed.buffers["list_rows"].tolist() == [1, 1, 0], (mode, config)
            # the histogram programs' valid tokens: every token for top_k, the finite ones else
            valid = torch.full((3,), n) if mode == "top_k" else torch.isfinite(x).sum(dim=1)
            assert torch.equal(listed.buffers["part_valid"].cpu().view(3, -1).sum(dim=1).long(), valid), (mode, ppr)
            poisoned = data.clone()
            assert all(map(_same_bits, _filtered_pipeline(poisoned, mode, config, _PoisonOffTheListRun(poisoned, [0, 1]),
                                                          ppr), got)), (mode, config, ppr)
            for bins, fraction in ((0, ops.PRELIST_FRACTION), (ops.PRELIST_BINS, 1e-9)):
                monkeypatch.setattr(ops, "PRELIST_BINS", bins)
                monkeypatch.setattr(ops, "PRELIST_FRACTION", fraction)
                whole = _RecordingRun()
                _assert_same_results(mode, _filtered_pipeline(data, mode, config, whole, ppr), got,
                                     (mode, config, ppr, bins))
                _assert_same_compaction(whole, listed, n, (mode, config, ppr, bins))
                masks = ops.filter_rows(data, **config, programs_per_row=ppr) if mode == "threshold" else None
                for name in ("PRELIST_BINS", "PRELIST_FRACTION"):
                    monkeypatch.setattr(ops, name, default[name])
                if masks is not None:
                    assert torch.equal(ops.filter_rows(data, **config, programs_per_row=ppr), masks), (config, ppr)
            # pre-lists that end just short of row 0's bins: at its last boundary bin hi (bins
            # 0..hi-1 listed) and at lo - 1 (a sure-kept bin left out): row 0 reads its logits,
            # unless the shorter list still holds its prefix (exact mass past it); either way the
            # results are those of the full list
            lo, hi = (int(listed.buffers["plan"][0, slot]) for slot in (kernels.PLAN_LO.value, kernels.PLAN_HI.value))
            for edge in {e for e in (hi, lo - 1) if 0 < e < default["PRELIST_BINS"]}:
                monkeypatch.setattr(ops, "PRELIST_BINS", edge)
                whole = _RecordingRun()
                _assert_same_results(mode, _filtered_pipeline(data, mode, config, whole, ppr), got, (mode, config, edge))
                _assert_same_compaction(whole, listed, n, (mode, config, edge))
            monkeypatch.setattr(ops, "PRELIST_BINS", default["PRELIST_BINS"])
            if mode == "sample":
                # sure-kept tokens raced in place, inside the compaction (noise drawn by position
                # in the row): those rows read their logits, pre-list or not
                monkeypatch.setattr(ops, "SURE_LIST_MAX", 0)
                monkeypatch.setattr(ops, "COMPACT_RACE_PROGRAMS_PER_SM", 1 << 20)
                raced = _filtered_pipeline(data, mode, config, _RecordingRun(), ppr)
                monkeypatch.setattr(ops, "PRELIST_BINS", 0)
                assert all(map(_same_bits, _filtered_pipeline(data, mode, config, _RecordingRun(), ppr), raced))
                for name in ("PRELIST_BINS", "SURE_LIST_MAX", "COMPACT_RACE_PROGRAMS_PER_SM"):
                    monkeypatch.setattr(ops, name, default[name])
    ops.plan.cache_clear()


def _pre_list_on_small_grids(monkeypatch):
    """Every filtered call makes the pre-list, on segments of 32 tokens, and lists its sure-kept
    tokens (a call without a pre-list would otherwise race them in place on small grids)."""
    monkeypatch.setattr(ops, "PRELIST_MIN_PROGRAMS_PER_SM", 0)
    monkeypatch.setattr(ops, "SURE_LIST_MAX_IN_COMPACTION", ops.SURE_LIST_MAX)
    monkeypatch.setattr(ops, "MAX_WIDTH", 32)
    ops.plan.cache_clear()


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
@pytest.mark.parametrize("mode, config", [("sample", dict(top_p=0.9999)), ("sample", dict(top_k=150)),
                                          ("sample", dict(min_p=1e-5, temperature=0.8)),
                                          ("sample", dict(top_k=150, top_p=0.95, min_p=0.05)),
                                          ("threshold", dict(top_p=0.9995, min_p=2e-5)), ("top_k", dict(top_k=200))])
def test_rows_whose_prefix_passes_the_pre_list_count_their_logits(device, monkeypatch, mode, config):
    """A complete pre-list that cannot hold the kept prefix (top-p's mass past it, more than its
    length in top-k, min-p reaching past its bins) leaves the bins to be counted from the whole
    row: the row's plan, what the compaction hands on and the results equal a call without a
    pre-list."""
    _pre_list_on_small_grids(monkeypatch)
    g = torch.Generator().manual_seed(5)
    n = 400
    x = (torch.randn(2, n, generator=g) * torch.tensor([[6.0], [8.0]])).to(device)
    try:
        listed = _RecordingRun()
        got = _filtered_pipeline(x, mode, config, listed, 3)
        count, stride = listed.buffers["prelist_count"].cpu(), listed.buffers["prelist"].shape[1]
        assert (count <= stride).all() and (count < n).all(), count
        assert listed.buffers["list_rows"].tolist() == [0, 0]
        monkeypatch.setattr(ops, "PRELIST_BINS", 0)
        whole = _RecordingRun()
        assert all(map(_same_bits, _filtered_pipeline(x, mode, config, whole, 3), got))
        assert _compaction_results(whole, n) == _compaction_results(listed, n)
    finally:
        monkeypatch.undo()
        ops.plan.cache_clear()


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_pre_list_decision_at_its_margins(device, monkeypatch):
    """``_pre_list_holds_prefix`` on either side of each of its edges: k at the list's length and
    one past it, min-p's last bin one inside the list's bins and at the last of them, top-p just
    inside and just past the list's mass less four times the plan's slack (per-row p), min-p
    with top-k past the list (counted from the list) and with top-k and top-p both on (from the
    row). The rows go where the rule says, and the results equal calls without a pre-list."""
    default_bins = ops.PRELIST_BINS
    _pre_list_on_small_grids(monkeypatch)
    g = torch.Generator().manual_seed(11)
    n = 400
    x = torch.randn(2, n, generator=g, dtype=torch.float64).float() * torch.tensor([[6.0], [8.0]])
    m = x.max(dim=1, keepdim=True).values
    listed = (m - x) * ops.BINS_PER_NAT < ops.PRELIST_BINS  # the bins below PRELIST_BINS, as the kernels bin
    w = torch.exp((x - m).double())
    ratio = (w * listed).sum(1) / w.sum(1)
    lengths = listed.sum(1)
    slack = 4 * kernels.MASS_SLACK.value
    edge = math.exp(-(ops.PRELIST_BINS - 1) / ops.BINS_PER_NAT)  # min-p whose last bin is PRELIST_BINS - 1
    cases = [
        (dict(top_k=int(lengths.min())), [1, 1]), (dict(top_k=int(lengths.max()) + 1), [0, 0]),
        (dict(min_p=edge * 1.02), [1, 1]), (dict(min_p=edge * 0.98), [0, 0]),
        (dict(top_p=(ratio - slack - 2e-4).float().to(device)), [1, 1]),
        (dict(top_p=(ratio - slack + 2e-4).clamp(max=1.0).float().to(device)), [0, 0]),
        (dict(top_k=int(lengths.max()) + 1, min_p=0.05), [1, 1]),
        (dict(top_k=int(lengths.max()) + 1, top_p=0.95, min_p=0.05), [0, 0]),
    ]
    data = x.to(device)
    try:
        for config, rows in cases:
            got_run = _RecordingRun()
            got = _filtered_pipeline(data, "sample", config, got_run, 3)
            assert (got_run.buffers["prelist_count"].cpu() == lengths.to(torch.int32)).all(), config
            assert got_run.buffers["list_rows"].tolist() == rows, config
            monkeypatch.setattr(ops, "PRELIST_BINS", 0)
            whole = _RecordingRun()
            _assert_same_results("sample", _filtered_pipeline(data, "sample", config, whole, 3), got, config)
            _assert_same_compaction(whole, got_run, n, config)
            monkeypatch.setattr(ops, "PRELIST_BINS", default_bins)
    finally:
        monkeypatch.undo()
        ops.plan.cache_clear()


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_bins_per_nat_is_a_power_of_two():
    # the pre-list's mark compares a token's gap to the maximum with -PRELIST_BINS / BINS_PER_NAT
    # instead of binning it (``_in_first_bins``): the same decision only when gap * BINS_PER_NAT is
    # exact
    assert math.frexp(ops.BINS_PER_NAT)[0] == 0.5


@pytest.mark.skipif(not KERNEL, reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_pre_list_holds_every_token_of_its_bins_once(device, monkeypatch):
    """The histogram pass lists each program's pre-list tokens once per chunk of LIST_CHUNK
    segments (one bit per lane and segment, bit 31 included). Segments of 8 tokens: one program
    per row over 32, 33, 38 and 64 segments (one chunk, a chunk and one segment, 32 + 6, two
    full chunks), two programs per row over 38. The programs' finite tokens sum to the row's.
    With room for all, the list holds exactly the tokens whose bin floor((m - x) * BINS_PER_NAT)
    lies below PRELIST_BINS, each once. At smaller
    capacities the count passes the capacity; where no program marked more than twice its share
    (none gave the list up) the count is exact and the list full of such tokens, each once. The
    sampled tokens equal those of a call without a pre-list."""
    monkeypatch.setattr(ops, "PRELIST_MIN_PROGRAMS_PER_SM", 0)
    monkeypatch.setattr(ops, "MIN_WIDTH", 8)
    monkeypatch.setattr(ops, "MAX_WIDTH", 8)
    ops.plan.cache_clear()
    whole, pre_bins = ops.PRELIST_FRACTION, ops.PRELIST_BINS
    config = dict(top_p=0.9)
    reached = set()  # below the capacity: "full" (no program gave the list up), "given up"
    for n, ppr, fractions in ((256, 1, (whole,)), (264, 1, (whole,)), (512, 1, (whole,)),
                              (300, 1, (whole, 0.045, 0.02)), (300, 2, (whole, 0.045, 0.02))):
        g = torch.Generator().manual_seed(5)
        x = torch.randn(2, n, generator=g) * torch.tensor([[8.0], [6.0]])
        x[0, 17] = float("-inf")
        x[:, 31 * 8 + 3] = x.max(dim=1).values - 1.0  # a mark in segment 31: bit 31 of its lane
        # the pre-list's edge: an integer maximum, a token exactly PRELIST_BINS bins below it (not
        # listed), one 2^-10 above (listed) and one 2^-10 below (all exact in float32)
        x[:, 40] = x.max(dim=1).values.ceil()
        edge = x[:, 40] - ops.PRELIST_BINS / ops.BINS_PER_NAT
        x[:, 5], x[:, 6], x[:, 7] = edge, edge + 2.0 ** -10, edge - 2.0 ** -10
        m = x.max(dim=1, keepdim=True).values
        bins = ((m - x) * ops.BINS_PER_NAT).clamp(0.0, ops.NUM_BINS - 1.0).floor()
        near = torch.isfinite(x) & (bins < ops.PRELIST_BINS)
        want = [sorted(torch.nonzero(near[r]).flatten().tolist()) for r in range(2)]
        assert near[:, 6].all() and not near[:, 5].any() and not near[:, 7].any()
        assert 8 < min(map(len, want)) and max(map(len, want)) < n // 4
        monkeypatch.setattr(ops, "PRELIST_BINS", 0)
        plain = _filtered_pipeline(x.to(device), "sample", config, _RecordingRun(), ppr)[0]
        monkeypatch.setattr(ops, "PRELIST_BINS", pre_bins)
        for fraction in fractions:
            monkeypatch.setattr(ops, "PRELIST_FRACTION", fraction)
            run = _RecordingRun()
            assert torch.equal(_filtered_pipeline(x.to(device), "sample", config, run, ppr)[0], plain), (n, ppr)
            count, listed = run.buffers["prelist_count"].cpu(), run.buffers["prelist"].cpu()
            # the programs' finite tokens, over programs of more than one chunk of segments
            valid = run.buffers["part_valid"].cpu().view(2, -1).sum(dim=1).long()
            assert torch.equal(valid, torch.isfinite(x).sum(dim=1)), (n, ppr, valid)
            stride = listed.shape[1]
            span = -(-n // (8 * ppr)) * 8  # the columns of one program
            for r in range(2):
                kept = listed[r, :min(int(count[r]), stride)].tolist()
                marked = [int(near[r, p * span:(p + 1) * span].sum()) for p in range(ppr)]
                if fraction == whole:
                    assert int(count[r]) == len(want[r]) and sorted(kept) == want[r], (n, ppr, r)
                    continue
                assert int(count[r]) > stride, (n, ppr, fraction, r)
                if all(c * ppr <= 2 * stride for c in marked):
                    reached.add("full")
                    assert int(count[r]) == len(want[r]), (n, ppr, fraction, r)
                    assert len(kept) == stride and len(set(kept)) == stride and set(kept) <= set(want[r])
                else:
                    reached.add("given up")
    assert reached == {"full", "given up"}
    ops.plan.cache_clear()


def test_top_k_beyond_the_kernel_limit_uses_a_stable_sort(device, monkeypatch):
    monkeypatch.setattr(ops, "TOP_K_KERNEL_MAX", 2)
    x = torch.tensor([[1.0, 2.0, 2.0, 0.0]], device=device)
    values, indices = treefold.top_k(x, 3)
    assert indices.tolist() == [[1, 2, 0]] and values.tolist() == [[2.0, 2.0, 1.0]]


# --------------------------------------------------------------------------------------------
# The mask functions
# --------------------------------------------------------------------------------------------

MASKS = [("top_k_mask", 7, dict(top_k=7)), ("top_p_mask", 0.75, dict(top_p=0.75)),
         ("min_p_mask", 0.08, dict(min_p=0.08))]


@pytest.mark.parametrize("name, arg, config", MASKS, ids=[m[0] for m in MASKS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masks_equal_reference(device, name, arg, config, dtype):
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(4, 33, generator=g) * 2).to(dtype)
    x[0, 3] = float("nan")
    x[3] = float("-inf")
    fn = getattr(treefold, name)
    on_host = torch.device(device).type == "cpu"
    if on_host:
        # a row without a finite logit has nothing to keep: on the host, an error naming it
        for probs in (False, True):
            with pytest.raises(ValueError, match=rf"{name}: x row\(s\) 3 .*hold no finite value"):
                fn(x, arg, probs=probs)
        x = x[:3]  # on the GPU (never read back) the row keeps nothing, checked below
    masked = fn(x.to(device), arg).cpu()
    want = ref.filter_mask(x, **config)
    assert masked.dtype == dtype
    assert torch.equal(torch.isfinite(masked), torch.isfinite(want))
    assert torch.equal(masked[torch.isfinite(masked)], x[torch.isfinite(want)])
    probs = fn(x.to(device), arg, probs=True).cpu()
    want_p = ref.filter_mask(x, probs=True, **config)
    assert probs.dtype == torch.float32
    # float32 probabilities: exp and the division round, relative error a few ulps
    torch.testing.assert_close(probs[:3], want_p[:3], rtol=2e-6, atol=1e-7)
    if not on_host:
        assert torch.isnan(probs[3]).all() and torch.isinf(masked[3]).all()
    torch.testing.assert_close(probs[:3].sum(-1), torch.ones(3), rtol=1e-5, atol=0)


def test_masks_take_per_row_parameters(device):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(3, 25, generator=g).to(device)
    ks = torch.tensor([1, 5, 25], device=device)
    kept = torch.isfinite(treefold.top_k_mask(x, ks)).sum(-1)
    assert kept.tolist() == [1, 5, 25]
    ps = torch.tensor([0.3, 0.9, 1.0], device=device)
    want = torch.stack([torch.isfinite(ref.filter_mask(x[r:r + 1].cpu(), top_p=float(ps[r])))[0]
                        for r in range(3)])
    assert torch.equal(torch.isfinite(treefold.top_p_mask(x, ps)).cpu(), want)
    bad_k = torch.tensor([0, 5, 26], device=device)
    if x.is_cuda:  # never read back: the rows keep nothing
        bad = treefold.top_k_mask(x, bad_k)
        assert torch.isinf(bad[0]).all() and torch.isinf(bad[2]).all()
    else:
        with pytest.raises(ValueError, match=r"top_k_mask: k is out of range in row\(s\) 0, 2 .*got 0"):
            treefold.top_k_mask(x, bad_k)
    # below the checks, on every device, such rows keep nothing
    bad = ops.sampling_filter(x, bad_k, None, None, False)
    assert torch.isinf(bad[0]).all() and torch.isinf(bad[2]).all()
    assert torch.equal(bad[1], treefold.top_k_mask(x[1:2], 5)[0])


def test_top_k_and_the_masks_pass_gradients_like_torch(device):
    # values and masks keep the kernels' bits when x needs a gradient; the gradient is torch's
    # for the same kept set: torch.topk's scatter, pass-through for kept logits, softmax's over
    # the kept tokens for probabilities; every k takes the same path (k > 1024 sorts)
    g = torch.Generator().manual_seed(14)
    x0 = torch.randn(4, 1100, generator=g).to(device)
    x0[0, 3] = float("nan")  # a NaN ranks first: its bits too are the kernels'
    x0[3] = float("-inf")  # a row without a finite logit
    int_view = {torch.float32: torch.int32}[x0.dtype]
    dy_of = lambda t: torch.randn(t.shape, generator=g).to(device)
    for k in (5, 1050):
        x = x0.clone().requires_grad_()
        values, indices = treefold.top_k(x, k)
        want_values, want_indices = treefold.top_k(x0, k)
        assert values.requires_grad and torch.equal(values.detach().view(int_view), want_values.view(int_view))
        dy = dy_of(values)
        (got,) = torch.autograd.grad(values, x, dy)
        assert torch.equal(got, torch.zeros_like(x0).scatter_(-1, want_indices, dy))
    # the row without a finite logit keeps nothing in the masks on the GPU; on the CPU it is an
    # error (test_masks_equal_reference), so the masks there take the other rows
    xm = x0 if x0.is_cuda else x0[:3]
    for probs in (False, True):
        for mask, arg in ((treefold.top_k_mask, 7), (treefold.top_p_mask, 0.8), (treefold.min_p_mask, 0.05)):
            x = xm.clone().requires_grad_()
            out = mask(x, arg, probs=probs)
            want = mask(xm, arg, probs=probs)
            assert out.requires_grad and torch.equal(out.detach().view(int_view), want.view(int_view))
            kept = torch.isfinite(want) & (want != 0)
            assert x0.is_cuda == (len(kept) == 4) and not kept[3:].any()
            dy = dy_of(out)  # a gradient arrives at dropped tokens and at the row that keeps nothing
            (got,) = torch.autograd.grad(out, x, dy)
            assert torch.equal(got[~kept], torch.zeros_like(got[~kept]))  # dropped tokens get none
            xd = xm.double().requires_grad_()
            if probs:
                ref_out = torch.softmax(torch.where(kept, xd, torch.where(kept.any(-1, keepdim=True), float("-inf"), 0.0)), -1)
                ref_out = ref_out * kept.any(-1, keepdim=True)
            else:
                ref_out = torch.where(kept, xd, 0.0)
            (ref_grad,) = torch.autograd.grad(ref_out, xd, dy.double())
            torch.testing.assert_close(got.double(), ref_grad, rtol=1e-5, atol=1e-7)


def test_torch_compile_fullgraph(device):
    g = torch.Generator().manual_seed(12)
    x = torch.randn(4, 30, generator=g).to(device)
    seeds = torch.arange(4, device=device)
    fn = torch.compile(lambda x, s: (treefold.sample(x, seed=s, top_k=5, top_p=0.9),
                                     treefold.top_k(x, 3)[1]), fullgraph=True)
    tokens, indices = fn(x, seeds)
    assert torch.equal(tokens, treefold.sample(x, seed=seeds, top_k=5, top_p=0.9))
    assert torch.equal(indices, treefold.top_k(x, 3)[1])


# --------------------------------------------------------------------------------------------
# GPU tier
# --------------------------------------------------------------------------------------------

VOCAB = 151936


def qwen_like_logits(rows: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(rows, VOCAB, device="cuda", generator=g) * scale


def assert_sample_routes(monkeypatch, x, seeds, launcher: str, routes) -> None:
    """For each (config, routed) of ``routes``: ``treefold.sample(x, **config)`` gives the
    pipeline's tokens (``sample_rows``), eager and prepared (the second call of a kind), and
    takes ``ops.<launcher>`` exactly where ``routed`` says."""
    taken = []
    chosen = getattr(ops, launcher)
    monkeypatch.setattr(ops, launcher, lambda *a, **kw: taken.append(1) or chosen(*a, **kw))
    monkeypatch.setattr(ops, "_PREPARED", {})
    for config, routed in routes:
        want = ops.sample_rows(x, config.get("temperature", 1.0), None, config.get("top_p"), config.get("min_p"),
                               seeds, 9)
        taken.clear()
        for _ in range(2):  # the second call goes through the prepared launches
            assert torch.equal(treefold.sample(x, seed=seeds, offset=9, **config), want), config
        assert bool(taken) == routed, config


def compared_rows(rows: int, dtype: torch.dtype, seed: int) -> tuple:
    """(peaked, flat, seeds) for the GPU tests that compare two launch forms' tokens: peaked logits
    (``seed``) whose last row holds NaN and whose row 1 has no finite logit (its token is -1),
    flat ones (``seed + 1``), and a seed per row."""
    x = qwen_like_logits(rows, seed).to(dtype)
    x[-1, ::5] = float("nan")
    flat = qwen_like_logits(rows, seed + 1, scale=1.0).to(dtype)
    if rows > 1:
        x[1] = float("-inf")
    return x, flat, torch.arange(rows, device="cuda") * 7919 + 3


@pytest.mark.gpu
@pytest.mark.parametrize("config", [dict(), dict(top_k=50), dict(top_p=0.9),
                                    dict(top_k=50, top_p=0.9), dict(min_p=0.05)],
                         ids=["plain", "topk", "topp", "topk-topp", "minp"])
def test_gpu_chi_square_vocab_151936(config):
    row = qwen_like_logits(1, 0)
    probs = ref.filtered_probs(row.cpu(), **config)[0].numpy()
    order = np.argsort(-probs, kind="stable")
    # coarse bins over the tokens ranked by probability, each expecting >= 5 % of the draws
    bins = np.zeros(VOCAB, dtype=np.int64)
    acc, b = 0.0, 0
    for t in order:
        bins[t] = b
        acc += probs[t]
        if acc >= 0.05 * (b + 1) and probs[t] > 0:
            b += 1
    bin_probs = np.bincount(bins, weights=probs, minlength=b + 1)
    draws = []
    for call in range(20):
        x = row.expand(1000, -1)
        draws.append(treefold.sample(x, seed=torch.arange(1000, device="cuda") + 1000 * call,
                                     offset=call, **config))
    tokens = torch.cat(draws).cpu().numpy()
    assert (probs[tokens] > 0).all(), "a filtered-out token was drawn"
    stat, dof = chi_square(torch.from_numpy(bins[tokens]), bin_probs)
    assert stat < chi2_critical(dof), (stat, dof)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", [dict(), dict(temperature=0), dict(top_k=50, top_p=0.9),
                                    dict(min_p=0.05, top_p=0.95)], ids=["plain", "greedy",
                                                                        "topk-topp", "minp-topp"])
def test_gpu_batch_invariance_64(dtype, config):
    x = qwen_like_logits(64, 1).to(dtype)
    seeds = torch.randint(0, 1 << 62, (64,), device="cuda")
    offsets = torch.randint(0, 1000, (64,), device="cuda")
    batch = treefold.sample(x, seed=seeds, offset=offsets, **config)
    for r in range(0, 64, 9):
        alone = treefold.sample(x[r:r + 1], seed=seeds[r:r + 1], offset=offsets[r:r + 1], **config)
        assert alone.item() == batch[r].item()
    for ppr in (1, 3, 40):
        args = (config.get("temperature", 1.0), config.get("top_k"), config.get("top_p"),
                config.get("min_p"), seeds, offsets)
        for prefetch in (False, True):
            assert torch.equal(ops.sample_rows(x, *args, programs_per_row=ppr, prefetch=prefetch), batch)
    assert torch.equal(treefold.sample(x, seed=seeds, offset=offsets, **config), batch)
    want = ref.sample(x.cpu(), seed=seeds.cpu(), offset=offsets.cpu(), **config)
    assert (batch.cpu() == want).float().mean() >= 0.95


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 50, 1000, 2000])
@pytest.mark.parametrize("rows", [5, 16])
def test_gpu_top_k_equals_stable_sort(k, rows):
    # 5 rows: the pipeline; 16 rows, k <= 64: top_k by group maxima (TOP_K_LANES_MIN_ROWS)
    x = qwen_like_logits(rows, 2)
    x[3] = torch.round(x[3])  # heavy ties
    x[4] = 0.0  # one tie group: the bracket search
    values, indices = treefold.top_k(x, k)
    want_v, want_i = torch.sort(x, dim=-1, descending=True, stable=True)
    assert torch.equal(indices, want_i[:, :k]) and torch.equal(values, want_v[:, :k])


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 50, 64])
def test_gpu_top_k_by_lane_maxima_equals_stable_sort(k):
    # the vocabulary at the default plan; other splits among programs on rows of 5120 (5
    # segments), where even one program per row gathers few enough tokens to sort
    # (TOP_K_LANES_MAX_SORT: at 151936 logits it would gather 149 segments' worth)
    x = qwen_like_logits(64, 2)
    x[3] = torch.round(x[3])  # heavy ties
    x[4] = 0.0  # one tie group
    for logits, choices in ((x, (None,)), (x[:, :5120].contiguous(), (None, 1, 2))):
        want_v, want_i = torch.sort(logits, dim=-1, descending=True, stable=True)
        for programs in choices:
            values, indices = ops.top_k_lanes_rows(logits, k, programs_per_row=programs)
            assert torch.equal(indices, want_i[:, :k]) and torch.equal(values, want_v[:, :k]), programs
        one = ops.top_k_lanes_rows(logits[5:6], k)
        assert torch.equal(one[1], want_i[5:6, :k])


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 50, 64])
def test_gpu_sampling_under_top_k_by_group_maxima_gives_the_pipelines_tokens(k):
    # top-k alone, and with top-p and min-p inside it
    x = qwen_like_logits(64, 3)
    x[3] = torch.round(x[3])  # heavy ties
    x[4, ::7] = float("nan")
    x[5] = float("-inf")  # nothing to sample: -1
    seeds = torch.randint(0, 1 << 62, (64,), device="cuda")
    offsets = torch.randint(0, 1000, (64,), device="cuda")
    ps = torch.linspace(0.2, 1.0, 64, device="cuda")
    # the vocabulary at the default plan; other splits among programs on rows of 5120 (as in
    # test_gpu_top_k_by_lane_maxima_equals_stable_sort)
    for logits, choices in ((x, (None,)), (x[:, :5120].contiguous(), (None, 1, 2))):
        for temperature, p, mp in ((1.0, None, None), (0.7, 0.9, None),
                                   (torch.linspace(0.3, 1.5, 64, device="cuda"), ps, 0.05)):
            want = ops.sample_rows(logits, temperature, k, p, mp, seeds, offsets)
            for programs in choices:
                got = ops.sample_top_k_lanes_rows(logits, temperature, k, p, mp, seeds, offsets,
                                                  programs_per_row=programs)
                assert torch.equal(got, want), (logits.shape, k, p, mp, programs)
            assert want[5].item() == -1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 16, 64])
def test_gpu_sample_under_top_k_takes_the_faster_launches_with_the_same_tokens(rows, dtype, monkeypatch):
    # treefold.sample under a scalar top_k: by group maxima from SAMPLE_TOP_K_LANES_MIN_ROWS
    # rows, the pipeline below; eager, prepared (the second call of a kind) and compiled calls
    # all give the pipeline's tokens
    x = qwen_like_logits(rows, 4).to(dtype)
    x[1, ::5] = float("nan")
    seeds = torch.arange(rows, device="cuda") * 7919 + 3
    taken = []
    lanes = ops.sample_top_k_lanes_rows
    monkeypatch.setattr(ops, "sample_top_k_lanes_rows", lambda *a, **kw: taken.append(1) or lanes(*a, **kw))
    monkeypatch.setattr(ops, "_PREPARED", {})
    least = ops.SAMPLE_TOP_K_LANES_MIN_ROWS if dtype == torch.float32 else ops.SAMPLE_TOP_K_LANES_MIN_ROWS_16BIT
    # (top_k=64 at 151936 logits gathers more than TOP_K_LANES_MAX_GATHER tokens a row: the pipeline
    # at every row count)
    for config, lanes_possible in ((dict(top_k=50), True), (dict(temperature=0.8, top_k=50, top_p=0.9), True),
                                   (dict(top_k=20, min_p=0.05), True),
                                   (dict(temperature=torch.full((rows,), 0.7, device="cuda"), top_k=40), True),
                                   (dict(top_k=64), False)):
        want = ops.sample_rows(x, config.get("temperature", 1.0), config["top_k"], config.get("top_p"),
                               config.get("min_p"), seeds, 9)
        taken.clear()
        for _ in range(2):  # the second call goes through the prepared launches
            assert torch.equal(treefold.sample(x, seed=seeds, offset=9, **config), want), config
        assert bool(taken) == (lanes_possible and rows >= least), (rows, config)
    compiled = torch.compile(lambda t: treefold.sample(t, top_k=50, seed=seeds, offset=9), fullgraph=True)
    assert torch.equal(compiled(x), ops.sample_rows(x, 1.0, 50, None, None, seeds, 9))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 64])
def test_gpu_sampling_under_min_p_by_one_race_gives_the_pipelines_tokens(rows, dtype, monkeypatch):
    # min-p's race against the pipeline at 151936 logits, 16 draws per row, peaked and flat rows,
    # NaN, a row without a finite logit, per-row min_p and temperatures (one greedy); then
    # treefold.sample sends min-p alone to it, eager, prepared (the second call of a kind) and
    # compiled, with the same tokens
    x, flat, seeds = compared_rows(rows, dtype, 7)
    temps = torch.linspace(0.0, 1.5, rows, device="cuda")
    mps = torch.linspace(0.0, 0.5, rows, device="cuda")
    for logits in (x, flat):
        for t, mp in ((1.0, 0.05), (0.7, 0.3), (temps, 0.1), (1.0, mps), (1.0, 0.0), (1.3, 1e-4)):
            for offset in range(16):
                want = ops.sample_rows(logits, t, None, None, mp, seeds, offset)
                got = ops.sample_min_p_rows(logits, t, mp, seeds, offset)
                assert torch.equal(got, want), (mp, offset)
    assert_sample_routes(monkeypatch, x, seeds, "sample_min_p_rows",
                         ((dict(min_p=0.05), True), (dict(temperature=temps, min_p=mps), True),
                          (dict(top_p=0.9, min_p=0.05), False)))
    compiled = torch.compile(lambda t: treefold.sample(t, min_p=0.05, seed=seeds, offset=9), fullgraph=True)
    assert torch.equal(compiled(x), ops.sample_rows(x, 1.0, None, None, 0.05, seeds, 9))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 24, 64])
def test_gpu_sampling_by_descent_gives_the_pipelines_tokens(rows, dtype, monkeypatch):
    # top-p and min-p by descent against the pipeline at 151936 logits, 16 draws per row (the
    # later rounds and the finishing loop are taken: top-p 0.02 needs many steps), peaked and
    # flat rows, NaN, a row without a finite logit; the rounds in one launch as well (``loop``: a
    # row's programs wait for one another), from the pre-list also with round 0 in a launch of its
    # own and without the held list segments; then, with DESCENT_SAMPLES, treefold.sample sends a scalar
    # top-p to it, eager, prepared (the second call of a kind) and compiled, with the same tokens
    # (over the row at one row, from the pre-list at 24 and 64)
    x, flat, seeds = compared_rows(rows, dtype, 5)
    temps = torch.linspace(0.3, 1.5, rows, device="cuda")
    mps = torch.linspace(0.01, 0.5, rows, device="cuda")
    launches = [dict(rounds=1, loop=False), dict(rounds=2, loop=False), dict(loop=True)]
    if rows >= ops.DESCENT_LISTED_MIN_ROWS:
        # (the loop from the pre-list takes round 0 into its launch and holds each program's first
        # list segment by default: also round 0 on its own, and in the loop without the segment)
        launches += [dict(loop=True, race_in_loop=False), dict(loop=True, race_in_loop=True, hold_share=False)]
    for logits in (x, flat):
        for t, p, mp in ((1.0, 0.9, None), (0.7, 0.5, None), (1.0, None, 0.05), (1.0, 0.9, 0.05),
                         (temps, 0.95, None), (1.0, None, mps), (1.0, 0.02, None)):
            for offset in range(16):
                want = ops.sample_rows(logits, t, None, p, mp, seeds, offset)
                for launch in launches:
                    got = ops.sample_descent_rows(logits, t, p, mp, seeds, offset, **launch)
                    assert torch.equal(got, want), (p, mp, offset, launch)
    monkeypatch.setattr(ops, "DESCENT_SAMPLES", True)
    assert_sample_routes(monkeypatch, x, seeds, "sample_descent_rows",
                         ((dict(top_p=0.9), True), (dict(temperature=0.8, min_p=0.05), False),
                          (dict(top_p=torch.full((rows,), 0.9, device="cuda")), False), (dict(top_p=0.3), False)))
    compiled = torch.compile(lambda t: treefold.sample(t, top_p=0.9, seed=seeds, offset=9), fullgraph=True)
    assert torch.equal(compiled(x), ops.sample_rows(x, 1.0, None, 0.9, None, seeds, 9))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 3])
def test_gpu_sure_kept_race_inside_or_after_the_compaction_gives_the_same_tokens(rows, monkeypatch):
    # flat rows keep tens of thousands of tokens for sure: they race them in place, in the
    # compaction's programs (a grid that fits at COMPACT_RACE_PROGRAMS_PER_SM) or in its race programs
    x = qwen_like_logits(rows, 6, scale=1.0)
    seeds = torch.arange(rows, device="cuda") * 31 + 7
    configs = (dict(top_p=0.9), dict(min_p=0.01), dict(top_k=torch.full((rows,), 40000, device="cuda"), top_p=0.95))

    def tokens():
        return [ops.sample_rows(x, 0.9, c.get("top_k"), c.get("top_p"), c.get("min_p"), seeds, 5) for c in configs]

    monkeypatch.setattr(ops, "COMPACT_RACE_PROGRAMS_PER_SM", 1 << 20)
    inside = tokens()
    monkeypatch.setattr(ops, "COMPACT_RACE_PROGRAMS_PER_SM", 0)
    apart = tokens()
    for a, b in zip(inside, apart):
        assert torch.equal(a, b)
        assert (a >= 0).all()


@pytest.mark.gpu
def test_gpu_compaction_from_the_pre_list_gives_the_same_results(monkeypatch):
    # 64 rows of 151936: peaked rows (standard deviation 4) count their bins from their pre-list
    # and the compaction reads it (poisoning the logits off it before the compaction changes
    # nothing), flat ones (standard deviation 1: over a quarter of the row within 10 nats of the
    # maximum) their logits; the results those of calls without a pre-list
    default_bins = ops.PRELIST_BINS
    peaked = 40  # the first rows; the others are flattened
    x = qwen_like_logits(64, 8, scale=4.0)
    x[peaked:] = x[peaked:] / 4
    for mode, config in PRE_LIST_CASES:
        for data in (x, x.bfloat16()):
            listed = _RecordingRun()
            want = _filtered_pipeline(data, mode, config, listed)
            count, stride = listed.buffers["prelist_count"].cpu(), listed.buffers["prelist"].shape[1]
            assert (count[:peaked] <= stride).all() and (count[peaked:] > stride).all(), (mode, config)
            from_list = listed.buffers["list_rows"].cpu()
            assert from_list[:peaked].all() and not from_list[peaked:].any(), (mode, config)
            poisoned = data.clone()
            assert all(map(_same_bits, _filtered_pipeline(poisoned, mode, config, _PoisonOffTheListRun(poisoned, range(peaked))),
                           want)), (mode, config, data.dtype)
            monkeypatch.setattr(ops, "PRELIST_BINS", 0)
            _assert_same_results(mode, _filtered_pipeline(data, mode, config, _RecordingRun()), want,
                                 (mode, config, data.dtype))
            monkeypatch.setattr(ops, "PRELIST_BINS", default_bins)
    # 600 rows of 5 tokens, one of them 20 nats above the others: a grid of several waves whose
    # pre-lists hold one token each at a capacity of 1 (which the GPU launcher passes as a constant)
    tiny = qwen_like_logits(600, 9)[:, :5].clone()
    tiny[:, 0] += 20.0
    tiny_want = ops.sample_rows(tiny, 1.0, None, 0.9, None, 3, 4)
    monkeypatch.setattr(ops, "PRELIST_BINS", 0)
    assert torch.equal(ops.sample_rows(tiny, 1.0, None, 0.9, None, 3, 4), tiny_want)


@pytest.mark.gpu
def test_gpu_masks_and_flat_rows():
    x = qwen_like_logits(8, 3)
    x[5] = x[5] / 3  # flat: long boundary lists
    for name, arg, config in MASKS:
        got = getattr(treefold, name)(x, arg, probs=True)
        want = ref.filter_mask(x.cpu(), probs=True, **config)
        assert ((got.cpu() > 0) != (want > 0)).sum() <= 2
        torch.testing.assert_close(got.sum(-1).cpu(), torch.ones(8), rtol=1e-4, atol=0)


@pytest.mark.gpu
def test_gpu_cuda_graph_replays_with_fresh_offsets():
    x = qwen_like_logits(4, 4)
    seeds = torch.tensor([1, 2, 3, 4], device="cuda")
    offset = torch.zeros(1, dtype=torch.int64, device="cuda")
    out = torch.empty(4, dtype=torch.int64, device="cuda")
    for _ in range(2):  # compile and warm up outside the graph
        out.copy_(treefold.sample(x, seed=seeds, offset=offset, top_k=50, top_p=0.9))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(treefold.sample(x, seed=seeds, offset=offset, top_k=50, top_p=0.9))
    seen = []
    for step in range(6):
        offset.fill_(step)
        graph.replay()
        want = treefold.sample(x, seed=seeds, offset=step, top_k=50, top_p=0.9)
        assert torch.equal(out, want)
        seen.append(out.clone())
    assert len({tuple(t.tolist()) for t in seen}) > 1


@pytest.mark.gpu
def test_gpu_cuda_graph_replays_with_per_row_parameters_and_bad_rows():
    # every parameter a per-row device tensor, changed between replays; a row with no finite
    # logit and a row with an invalid parameter give -1 inside the graph as outside it
    x = qwen_like_logits(6, 4)
    x[4] = float("-inf")
    seeds = torch.tensor([1, 2, 3, 4, 5, 6], device="cuda")
    offset = torch.zeros(6, dtype=torch.int64, device="cuda")
    t = torch.tensor([0.7, 1.0, 1.3, 0.0, 1.0, 1.0], device="cuda")
    k = torch.tensor([50, 151936, 20, 5, 50, 50], device="cuda")
    p = torch.tensor([0.9, 0.95, 1.0, 0.5, 0.9, 0.9], device="cuda")
    mp = torch.tensor([0.0, 0.05, 0.1, 0.0, 0.0, 2.0], device="cuda")  # row 5: min_p out of range

    def call():
        return treefold.sample(x, temperature=t, top_k=k, top_p=p, min_p=mp, seed=seeds, offset=offset)

    out = torch.empty(6, dtype=torch.int64, device="cuda")
    for _ in range(2):  # compile and warm up outside the graph
        out.copy_(call())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(call())
    for step in range(4):
        offset.fill_(step)
        t[1] = 1.0 + 0.25 * step
        p[0] = 0.9 - 0.1 * step
        graph.replay()
        want = call()
        assert torch.equal(out, want), step
        assert out[4].item() == -1 and out[5].item() == -1


def test_dependent_launch_options(monkeypatch):
    """The passes chain as programmatic dependent launches only where the device supports them:
    never on the CPU (the interpreter), and not when DEPENDENT_LAUNCH is off."""
    assert ops._chained(torch.device("cpu")) == ({}, {}, {})
    if CUDA and dependent_launch("cuda", torch.cuda.current_device()):
        cuda = torch.device("cuda", torch.cuda.current_device())
        assert ops._chained(cuda) == (dict(RELEASE_DEPENDENTS=True),
                                      dict(WAIT_FOR_PRIOR=True, RELEASE_DEPENDENTS=True, launch_pdl=True),
                                      dict(WAIT_FOR_PRIOR=True, launch_pdl=True))
        monkeypatch.setattr(ops, "DEPENDENT_LAUNCH", False)
        assert ops._chained(cuda) == ({}, {}, {})


class _OptionsRun(ops._Run):
    """Records each launch's launcher and keyword options instead of launching (the passes read
    nothing back on the host, so a call runs through without a device)."""

    def __init__(self):
        super().__init__()
        self.launches = []

    def __call__(self, launcher, grid, *args, **kwargs):
        self.launches.append((launcher, kwargs))


def test_each_pass_gets_its_place_in_the_chain(monkeypatch):
    """With dependent launches on, a call's first pass only releases the next, every later pass
    waits for the one before (launched as a dependent launch), the last releases nothing, and
    the mask that filter_rows applies after the passes is an ordinary launch."""
    monkeypatch.setattr(ops, "dependent_launch", lambda device_type, index: True)  # as on sm_90
    runs = []
    monkeypatch.setattr(ops, "_Run", lambda *a, **k: runs.append(_OptionsRun()) or runs[-1])
    x = torch.randn(2, 300)
    seeds = torch.tensor([1, 2])
    chained = {"launch_pdl", "WAIT_FOR_PRIOR", "RELEASE_DEPENDENTS"}
    for config in (dict(top_p=0.9), dict(top_k=5), dict(min_p=0.1, top_p=0.8), dict(), dict(temperature=0.0)):
        for race_per_sm in (0, 1 << 20):  # the sure-kept race by race programs, or inside the compaction's
            monkeypatch.setattr(ops, "COMPACT_RACE_PROGRAMS_PER_SM", race_per_sm)
            ops.sample_rows(x, config.get("temperature", 1.0), config.get("top_k"), config.get("top_p"),
                            config.get("min_p"), seeds, 0)
            options = [{k for k in kwargs if k in chained and kwargs[k]} for _, kwargs in runs[-1].launches]
            assert len(options) >= 2, config
            assert options[0] == {"RELEASE_DEPENDENTS"}, (config, options)
            assert all(o == chained for o in options[1:-1]), (config, options)
            assert options[-1] == {"WAIT_FOR_PRIOR", "launch_pdl"}, (config, options)
    ops.sample_min_p_rows(x, 1.0, 0.1, seeds, 0)  # the maxima, min-p's race, its combine
    options = [{k for k in kwargs if k in chained and kwargs[k]} for _, kwargs in runs[-1].launches]
    assert options == [{"RELEASE_DEPENDENTS"}, chained, {"WAIT_FOR_PRIOR", "launch_pdl"}], options
    ops.filter_rows(x, None, 0.8, None, probs=True)
    (resolve, _), (apply, applied) = runs[-1].launches[-2:]
    assert resolve is ops._RESOLVE and apply is ops._APPLY
    assert not chained & set(applied), applied


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 64])
def test_gpu_dependent_launches_give_the_same_results(rows, monkeypatch, poison_allocations):
    """Every mode with its passes chained as dependent launches equals the ordinary launches,
    eagerly and replayed from a CUDA graph, with every buffer poisoned when it is allocated (in
    the graph too, so each replay refills them): a pass that read before the previous one's
    writes landed would see the poison, not the last call's values."""
    if not dependent_launch("cuda", torch.cuda.current_device()):
        pytest.skip("the device has no programmatic dependent launch")
    x = qwen_like_logits(rows, 5)
    seeds = torch.arange(rows, device="cuda") * 7919 + 1
    calls = [lambda c=c: (ops.sample_rows(x, c.get("temperature", 1.0), c.get("top_k"), c.get("top_p"),
                                          c.get("min_p"), seeds, 3),)
             for c in (dict(top_p=0.9), dict(min_p=0.05), dict(top_k=50), dict(top_k=50, top_p=0.9), dict(),
                       dict(temperature=0.0))]
    calls.append(lambda: (ops.sample_min_p_rows(x, 1.0, 0.05, seeds, 3),))  # the maxima, min-p's race, combine
    graphed = len(calls)  # the sampling calls replay from a graph too
    calls += [lambda: ops.top_k_rows(x, 50), lambda: (ops.filter_rows(x, None, 0.8, None, probs=True),)]
    monkeypatch.setattr(ops, "DEPENDENT_LAUNCH", False)
    want = [[t.clone() for t in fn()] for fn in calls]
    monkeypatch.setattr(ops, "DEPENDENT_LAUNCH", True)
    poison_allocations()
    for i, (fn, w) in enumerate(zip(calls, want)):
        assert all(map(_same_bits, fn(), w)), i
        if i >= graphed:
            continue
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = fn()
        for _ in range(3):
            for t in outs:
                t.fill_(-1)
            graph.replay()
            torch.cuda.synchronize()
            assert all(map(_same_bits, outs, w)), i


# --------------------------------------------------------------------------------------------
# Prepared eager calls
# --------------------------------------------------------------------------------------------

class _RecordingLaunch:
    """Stands for a PreparedLaunch: records what it would launch with."""

    def __init__(self, accept=True):
        self.calls, self.accept = [], accept

    def accepts(self, scalars):
        return self.accept

    def __call__(self, *values, scalars=()):
        self.calls.append(([v if isinstance(v, int) else v.data_ptr() for v in values], scalars))
        return True

    def launch_addresses(self, addresses, scalars=()):
        self(*addresses, scalars=scalars)


def test_prepared_sample_places_buffers_in_one_workspace_and_fills_every_slot():
    buffers = {"part_max": torch.empty(7), "hist": torch.empty((3, 64), dtype=torch.int32),
               "boundary": torch.empty((3, 1000), dtype=torch.int32)}
    first, second = _RecordingLaunch(), _RecordingLaunch()
    call = PreparedPipeline(((first, ("x", "part_max", "hist"), ()),
                             (second, ("boundary", "seed", "token"), ("offset",))), buffers, (("token", (3,), torch.int64),))
    x, seed = torch.empty(3, 1000), torch.empty(3, dtype=torch.int64)
    out = call(x, {"seed": seed}, {"seed": seed, "offset": 17})
    assert out.shape == (3,) and out.dtype == torch.int64
    (addresses, scalars), = first.calls
    assert addresses[0] == x.data_ptr() and scalars == ()
    part_max, hist = addresses[1:]
    (addresses, scalars), = second.calls
    boundary = addresses[0]
    assert addresses[1:] == [seed.data_ptr(), out.data_ptr()] and scalars == (17,)
    # buffers at 256-byte steps, in order, each past the previous one's bytes
    assert hist - part_max == 256 and boundary - hist == 768
    assert all(a % 16 == 0 for a in (part_max, hist, boundary))
    # a launch that would decline: nothing launches, the caller takes the ordinary path
    refusing = PreparedPipeline(((first, ("x",), ()), (_RecordingLaunch(accept=False), ("x",), ("seed",))),
                                {}, (("token", (3,), torch.int64),))
    assert refusing(x, {}, {"seed": 1, "offset": 0}) is None and len(first.calls) == 1
    base = torch.empty(3 * 1000 + 1)
    assert call(base[1:].view(3, 1000), {"seed": seed}, {"seed": seed, "offset": 17}) is None
    # so does a tensor of the caller's off the 16-byte grid
    off_grid = torch.empty(4, dtype=torch.int64)[1:]
    assert call(x, {"seed": off_grid}, {"seed": off_grid, "offset": 17}) is None
    assert len(first.calls) == 1 and len(second.calls) == 1


def test_prepared_pipeline_without_buffers_allocates_no_workspace():
    # a one-launch reduction writes only its result: the call allocates that and launches
    launch = _RecordingLaunch()
    call = PreparedPipeline(((launch, ("x", "out"), ()),), {}, (("out", (3,), torch.float32),))
    assert call.workspace_bytes == 0
    x = torch.empty(3, 64)
    out = call(x, {}, {})
    assert out.shape == (3,) and launch.calls == [([x.data_ptr(), out.data_ptr()], ())]


def test_prepared_pipeline_allocates_each_output_in_its_slot():
    # top_k's prepared calls return values and indices: each output allocated anew per call, in
    # its slot, the plan's buffers in the workspace
    launch = _RecordingLaunch()
    call = PreparedPipeline(((launch, ("x", "hist", "values", "indices"), ()),),
                            {"hist": torch.empty((3, 64), dtype=torch.int32)},
                            (("values", (3, 5), torch.bfloat16), ("indices", (3, 5), torch.int64)))
    x = torch.empty(3, 100, dtype=torch.bfloat16)
    values, indices = call(x, {}, {})
    assert values.shape == (3, 5) and values.dtype == torch.bfloat16
    assert indices.shape == (3, 5) and indices.dtype == torch.int64
    (addresses, _), = launch.calls
    assert addresses[0] == x.data_ptr() and addresses[2:] == [values.data_ptr(), indices.data_ptr()]
    assert addresses[1] % 16 == 0 and addresses[1] not in (values.data_ptr(), indices.data_ptr())


def test_prepared_sample_keys():
    x = torch.empty(4, 100)
    seeds = torch.zeros(4, dtype=torch.int64)
    key = ops._sample_key(x, 0.7, 50, 0.9, None, 5, 3)
    # integer seeds and offsets fill slots: keyed by their type alone (the kernels do not
    # specialise on their values), so 1 and multiples of 16 are the same kind
    assert key == ops._sample_key(x, 0.7, 50, 0.9, None, 7, 9)
    assert key == ops._sample_key(x, 0.7, 50, 0.9, None, 7, 16) == ops._sample_key(x, 0.7, 50, 0.9, None, 1, 1)
    assert key != ops._sample_key(x, 0.7, 50, 0.9, None, 1 << 40, 3)  # a 64-bit seed
    assert key != ops._sample_key(x, 0.7, 50, 0.95, None, 5, 3)  # scalar parameters by value
    assert key != ops._sample_key(x, 0.7, 40, 0.9, None, 5, 3)
    assert ops._sample_key(x, 0.7, None, None, None, seeds, 3) != ops._sample_key(x, 0.7, None, None, None, 5, 3)
    assert ops._sample_key(x, 0.7, None, None, None, seeds, seeds) is None  # one tensor, two slots
    strided = torch.empty(4, 200)[:, :100]  # same shape, other row stride
    assert ops._sample_key(strided, 0.7, 50, 0.9, None, 5, 3) != key
    # greedy reads neither seed nor offset: they are not part of its kind
    assert ops._sample_key(x, 0.0, None, None, None, 5, 3) == ops._sample_key(x, 0.0, None, None, None, seeds, 1)


# one configuration per test (each compiles its own kernels: together they take minutes, which
# pytest-xdist spreads over processes): (temperature, top_k, top_p, min_p); "rows" a tensor per row
_PREPARED_SAMPLE_CONFIGS = [(0.0, None, None, None), (1.0, None, None, None), (0.7, None, 0.9, None),
                            (0.7, 50, None, None), (1.0, None, None, 0.05), ("rows", "rows", 0.8, None)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", _PREPARED_SAMPLE_CONFIGS,
                         ids=["greedy", "plain", "top-p", "top-k", "min-p", "per-row"])
def test_gpu_prepared_sample_calls_give_the_same_tokens(config):
    # eager sample() keeps prepared launches per kind of call; later calls of the kind take them
    # with new tensors and new integer seeds and offsets (counting decode steps)
    x = qwen_like_logits(5, 9)
    seeds = torch.arange(5, device="cuda") * 3 + 1
    t, k, p, mp = config
    t = torch.full((5,), 0.8, device="cuda") if t == "rows" else t
    k = torch.full((5,), 20, device="cuda") if k == "rows" else k
    c = dict(temperature=t, top_k=k, top_p=p, min_p=mp)
    ops._PREPARED.clear()
    for step in range(40):
        xs = x * (1 + step % 3)
        for seed in (seeds, 11 + step):
            got = treefold.sample(xs, seed=seed, offset=step, **c)
            want = ops.sample_rows(xs, t if isinstance(t, torch.Tensor) else float(t), k, p, mp, seed, step)
            assert torch.equal(got, want), (step, seed)
    # a kind per kind of seed (tensor or int), except greedy's, which reads no seed
    assert len(ops._PREPARED) >= (1 if config[0] == 0.0 else 2)
    if config == (0.7, 50, None, None):
        # the prepared calls themselves launch (a call that always declined would pass the
        # checks above): top-k 50 with per-row seeds is one kind for every offset (the drawing
        # kernels do not specialise offsets), and it takes offsets 1, 3 and 16 alike
        kinds = [prepared for key, prepared in ops._PREPARED.items()
                 if key[4:9] == ((float, 0.7), (int, 50), (type(None), None), (type(None), None),
                                 (seeds.shape, seeds.dtype))]
        assert len(kinds) == 1
        for offset in (1, 3, 16):
            out = kinds[0](x, {"seed": seeds}, {"seed": seeds, "offset": offset})
            assert out is not None, offset
            assert torch.equal(out, ops.sample_rows(x, 0.7, 50, None, None, seeds, offset)), offset


@pytest.mark.gpu
@pytest.mark.parametrize("rows, dtype", [(5, torch.float32), (9, torch.float32), (5, torch.bfloat16)])
def test_gpu_prepared_top_k_calls_give_the_same_values_and_indices(rows, dtype):
    # top_k keeps its own prepared launches, per (shape, strides, dtype, device, k), of the
    # pipeline (5 rows of float32) or of top_k by group maxima (TOP_K_LANES_MIN_ROWS)
    x = qwen_like_logits(rows, 9).to(dtype)
    ops._PREPARED.clear()
    for step in range(3):
        xs = x * (step + 1)
        for k in (1, 50):
            values, indices = treefold.top_k(xs, k)
            want_values, want_indices = ops.top_k_rows(xs, k)
            assert torch.equal(values, want_values) and torch.equal(indices, want_indices), (step, k)
    key = ("top_k", x.shape, x.stride(), x.dtype, x.get_device(), 50)
    values, indices = ops._PREPARED[key](x * 5, {}, {})
    assert torch.equal(indices, ops.top_k_rows(x * 5, 50)[1])


@pytest.mark.gpu
def test_gpu_prepared_mask_calls_give_the_same_masks():
    # and so do the masks, per kind of call
    x = qwen_like_logits(5, 9)
    ops._PREPARED.clear()
    ks = torch.full((5,), 20, device="cuda")
    for step in range(3):
        xs = x * (step + 1)
        for masked, want in ((treefold.top_p_mask(xs, 0.9, probs=True), ops.filter_rows(xs, None, 0.9, None, True)),
                             (treefold.min_p_mask(xs, 0.05), ops.filter_rows(xs, None, None, 0.05)),
                             (treefold.top_k_mask(xs, ks), ops.filter_rows(xs, ks, None, None))):
            assert masked.dtype == want.dtype and torch.equal(masked.isnan(), want.isnan()), step
            assert torch.equal(masked.nan_to_num(), want.nan_to_num()), step
    key = ops._filter_key(x, None, 0.9, None, True)
    assert torch.equal(ops._PREPARED[key](x * 5, {}, {}), ops.filter_rows(x * 5, None, 0.9, None, True))


@pytest.mark.skipif(not KERNEL or torch.cuda.is_available(), reason="the interpreter stands in for the GPU here")
@pytest.mark.parametrize("launches", ["top_k_rows", "top_k_lanes_rows"])
def test_prepared_top_k_calls_through_the_interpreter(monkeypatch, request, launches):
    # top_k's prepared launches (the pipeline's, or the two of top_k by group maxima, over
    # segments of 64 tokens: the interpreter sorts slowly) with new logits give the ordinary
    # path's values and indices, in newly allocated outputs
    prepare_through_the_interpreter(monkeypatch, ops)
    if launches == "top_k_lanes_rows":
        monkeypatch.setattr(ops, "MAX_WIDTH", 64)
        ops.plan.cache_clear()
        request.addfinalizer(ops.plan.cache_clear)  # (no plan of 64-token segments stays cached)
    top_k_rows = getattr(ops, launches)
    g = torch.Generator().manual_seed(13)
    x = torch.randn(3, 700, generator=g) * 3
    key = ("top_k", x.shape, x.stride(), x.dtype, x.get_device(), 20)
    first = top_k_rows(x, 20, prepare_key=key)
    assert torch.equal(first[1], ops.top_k_rows(x, 20)[1])
    launched = InterpretedPrepared.launched
    for step in range(2):
        xs = torch.randn(3, 700, generator=g) * (step + 2)
        xs[1, 3] = float("nan")
        values, indices = ops._PREPARED[key](xs, {}, {})
        want_values, want_indices = ops.top_k_rows(xs, 20)
        assert torch.equal(indices, want_indices) and torch.equal(values.isnan(), want_values.isnan())
        assert torch.equal(values.nan_to_num(), want_values.nan_to_num())
    assert InterpretedPrepared.launched > launched


def prepare_narrow_segments(monkeypatch, request) -> None:
    """The interpreter standing in for prepared launches, on segments of 64 tokens (plans made
    again before and after the test)."""
    prepare_through_the_interpreter(monkeypatch, ops)
    monkeypatch.setattr(ops, "MAX_WIDTH", 64)
    ops.plan.cache_clear()
    request.addfinalizer(ops.plan.cache_clear)


@pytest.mark.skipif(not KERNEL or torch.cuda.is_available(), reason="the interpreter stands in for the GPU here")
def test_prepared_descent_calls_through_the_interpreter(monkeypatch, request):
    # the descent's prepared launches (its partials in the workspace, seed and offset in their
    # slots) with new logits give the ordinary path's tokens
    prepare_narrow_segments(monkeypatch, request)
    g = torch.Generator().manual_seed(15)
    seeds = torch.tensor([4, 5, 6])
    # over the row, then from the pre-list (peaked rows: their lists hold the kept prefix; the
    # list, its partials and the rows' flags in the workspace too)
    for listed, scale in ((False, 3), (True, 6)):
        x = torch.randn(3, 300, generator=g) * scale
        for t, p, mp in ((1.0, 0.9, None), (0.7, 0.6, torch.tensor([0.01, 0.2, 0.5]))):
            key = ops._sample_key(x, t, None, p, mp, seeds, 1)
            first = ops.sample_descent_rows(x, t, p, mp, seeds, 1, listed=listed, prepare_key=key)
            assert torch.equal(first, ops.sample_rows(x, t, None, p, mp, seeds, 1))
            launched = InterpretedPrepared.launched
            for step in range(2):
                xs = torch.randn(3, 300, generator=g) * (step + scale - 1)
                xs[1, 3] = float("nan")
                got = ops._PREPARED[key](xs, ops._tensor_params(t, None, p, mp, seeds, 1), {"seed": seeds, "offset": 1})
                assert torch.equal(got, ops.sample_rows(xs, t, None, p, mp, seeds, 1)), (listed, p, mp, step)
            # (round 0, two rounds, the finish; with the list, the maxima and the histogram first)
            assert InterpretedPrepared.launched >= launched + 2 * (6 if listed else 4)


@pytest.mark.skipif(not KERNEL or torch.cuda.is_available(), reason="the interpreter stands in for the GPU here")
def test_prepared_min_p_calls_through_the_interpreter(monkeypatch, request):
    # min-p's race, prepared (the maxima and the partial winners in the workspace, seed and offset
    # and the per-row tensors in their slots), with new logits gives the pipeline's tokens
    prepare_narrow_segments(monkeypatch, request)
    g = torch.Generator().manual_seed(16)
    seeds = torch.tensor([4, 5, 6])
    x = torch.randn(3, 300, generator=g) * 3
    for t, mp, seed in ((1.0, 0.1, 7), (torch.tensor([0.7, 0.0, 1.2]), torch.tensor([0.01, 0.2, 0.5]), seeds)):
        key = ops._sample_key(x, t, None, None, mp, seed, 1)
        first = ops.sample_min_p_rows(x, t, mp, seed, 1, prepare_key=key)
        assert torch.equal(first, ops.sample_rows(x, t, None, None, mp, seed, 1))
        launched = InterpretedPrepared.launched
        for step in range(2):
            xs = torch.randn(3, 300, generator=g) * (step + 2)
            xs[1, 3] = float("nan")
            got = ops._PREPARED[key](xs, ops._tensor_params(t, None, None, mp, seed, step),
                                     {"seed": seed, "offset": step})
            assert torch.equal(got, ops.sample_rows(xs, t, None, None, mp, seed, step)), (mp, step)
        assert InterpretedPrepared.launched == launched + 2 * 3  # the maxima, the race, its combine


@pytest.mark.skipif(not KERNEL or torch.cuda.is_available(), reason="the interpreter stands in for the GPU here")
def test_prepared_mask_calls_through_the_interpreter(monkeypatch):
    # the masks' prepared launches (five passes and the masking one, per-row filter tensors in
    # their slots) with new logits give the ordinary path's outputs, bit for bit
    prepare_through_the_interpreter(monkeypatch, ops)
    g = torch.Generator().manual_seed(14)
    x = torch.randn(3, 500, generator=g) * 3
    configs = [(None, 0.9, None, True), (20, None, 0.05, False), (torch.tensor([5, 50, 400]), 0.8, None, True),
               (None, None, torch.tensor([0.01, 0.1, 0.5]), False)]
    for k, p, mp, probs in configs:
        key = ops._filter_key(x, k, p, mp, probs)
        ops.filter_rows(x, k, p, mp, probs=probs, prepare_key=key)
        launched = InterpretedPrepared.launched
        for step in range(2):
            xs = torch.randn(3, 500, generator=g) * (step + 2)
            xs[2, 7] = float("nan")
            got = ops._PREPARED[key](xs, ops._tensor_params(1.0, k, p, mp, 0, 0), {})
            want = ops.filter_rows(xs, k, p, mp, probs=probs)
            assert got.dtype == want.dtype and got.numpy().tobytes() == want.numpy().tobytes(), (k, p, mp, probs)
        assert InterpretedPrepared.launched >= launched + 2 * 2  # (the prepared calls launched)
    t = torch.tensor([0.5, 0.5, 0.5])
    assert ops._filter_key(x, None, t, t, False) is None  # one tensor, two slots


@pytest.mark.skipif(not KERNEL or torch.cuda.is_available(), reason="the interpreter stands in for the GPU here")
def test_prepared_sample_calls_through_the_interpreter(monkeypatch):
    # the whole prepared path (keys, slots, the workspace, integer seeds and offsets) on the
    # CPU, with Launcher.prepare standing in: a prepared call gives the ordinary path's tokens
    prepare_through_the_interpreter(monkeypatch, ops)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(3, 700, generator=g) * 3
    seeds = torch.tensor([4, 5, 6])
    temps = torch.tensor([0.5, 1.0, 2.0])
    configs = [(0.0, None, None, None), (1.0, None, None, None), (0.7, None, 0.9, None), (0.7, 20, None, None),
               (1.0, None, None, 0.05), (temps, torch.tensor([5, 50, 500]), 0.8, None),
               (0.0, torch.tensor([5, 50, 500]), None, None)]  # greedy through the filters: no seed read
    kinds = []
    for step in (0, 1, 2, 16, 17):
        xs = x * (1 + step % 2)
        for t, k, p, mp in configs:
            for seed, offset in ((seeds, step), (7 + step, step), (seeds, torch.tensor([step])), (step, step)):
                got = ops._sample_prepared(xs, t, k, p, mp, seed, offset)
                want = ops.sample_rows(xs, t, k, p, mp, seed, offset)
                assert torch.equal(got, want), (step, t, k, p, mp, seed, offset)
        kinds.append(len(ops._PREPARED))
    assert len(ops._PREPARED) >= 2 * len(configs)
    # integer seeds and offsets of 1 and of multiples of 16 are no kinds of their own
    assert kinds == [kinds[0]] * len(kinds), kinds
    # later calls of a kind took the prepared launches (two or more per call)
    assert InterpretedPrepared.launched >= 2 * 2 * len(configs) * 2
    # rows whose sure-kept tokens race in place, in the compaction or in a launch of their own
    defaults = ops.SURE_LIST_MAX, ops.COMPACT_RACE_PROGRAMS_PER_SM
    for race_per_sm in (0, 1 << 20):
        monkeypatch.setattr(ops, "SURE_LIST_MAX", 0)
        monkeypatch.setattr(ops, "COMPACT_RACE_PROGRAMS_PER_SM", race_per_sm)
        ops._PREPARED.clear()  # prepared calls keep the plan they were made with
        for step in (3, 4):
            got = ops._sample_prepared(x, 0.9, None, 0.95, None, seeds, step)
            assert torch.equal(got, ops.sample_rows(x, 0.9, None, 0.95, None, seeds, step)), race_per_sm
    monkeypatch.setattr(ops, "SURE_LIST_MAX", defaults[0])
    monkeypatch.setattr(ops, "COMPACT_RACE_PROGRAMS_PER_SM", defaults[1])
    ops._PREPARED.clear()
    ops._sample_prepared(x, 0.7, None, 0.9, None, seeds, 5)
    # and they alone answer here
    key = ops._sample_key(x, 0.7, None, 0.9, None, seeds, 5)
    out = ops._PREPARED[key](x, {"seed": seeds}, {"seed": seeds, "offset": 5})
    assert torch.equal(out, ops.sample_rows(x, 0.7, None, 0.9, None, seeds, 5))
