"""How many tokens a top-k pre-list would hold with a bound from the segment-max pass, against the
pre-list of today (every token within PRELIST_BINS / BINS_PER_NAT = 10 nats of the row's maximum),
on the CPU with NumPy: no kernel runs.

The bound: each program of the row pass (``sampling.plan``'s segments of WIDTH tokens,
SEGMENTS_PER_PROGRAM of them per program, lane j of a program seeing token j of each of its
segments) keeps each lane's maximum; T_p is the k-th largest of program p's lane maxima (minus
infinity when it has fewer than k lanes). Program p then holds at least k tokens >= T_p, so the
row's k-th largest is >= T = max_p T_p, and every token of the row's top k is >= T: a list of the
tokens >= T holds the top k by construction. Rounded down to the bins' edges (BINS_PER_NAT per nat
below the maximum), the list is whole bins, as the pre-list's is today.

    python benchmarks/probe_prelist_bound.py

Prints, per row kind and batch plan (eight rows each): the mean number of tokens within 10 nats of
the maximum, of tokens >= T and in the bins through T's, of tokens >= the k-th largest of all the
row's lane maxima (a tighter bound, which needs the programs' lane maxima brought together), and
the nats from the maximum to the k-th largest.
"""
import math

import numpy as np

VOCAB = 151936
WIDTH = 1024
BINS_PER_NAT = 4.0
PRELIST_NATS = 10.0
K = 50


def rows_of(kind: str, count: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "peaked (benchmark: N(0, 4^2))":
        return rng.standard_normal((count, VOCAB)) * 4.0
    if kind == "flat (benchmark: N(0, 2^2))":
        return rng.standard_normal((count, VOCAB)) * 2.0
    # a language model's logits: a heavy right tail (Gumbel scores of a Zipf-like prior)
    ranks = np.arange(1, VOCAB + 1)
    prior = -1.1 * np.log(ranks)
    out = np.empty((count, VOCAB))
    for r in range(count):
        out[r] = rng.permutation(prior) + rng.gumbel(size=VOCAB)
    return out


def lane_bounds(row: np.ndarray, programs: int, segments_per_program: int, k: int) -> tuple:
    """(max over programs of each program's k-th largest lane maximum, the k-th largest of all
    the row's lane maxima): both lower bounds of the row's k-th largest; the second needs the
    programs' lane maxima brought together (each program's k largest suffice), the first not."""
    padded = np.full(programs * segments_per_program * WIDTH, -np.inf)
    padded[:row.size] = row
    blocks = padded.reshape(programs, segments_per_program, WIDTH)
    lanes = blocks.max(axis=1)  # [programs, WIDTH]
    kth = np.sort(lanes, axis=1)[:, -k]
    return float(kth.max()), float(np.sort(lanes.ravel())[-k])


def main() -> None:
    rng = np.random.default_rng(0)
    segments = math.ceil(VOCAB / WIDTH)
    plans = {"64 rows (30 programs of 5 segments)": (30, 5), "1 row (149 programs of 1 segment)": (149, 1)}
    for kind in ("peaked (benchmark: N(0, 4^2))", "flat (benchmark: N(0, 2^2))", "Zipf prior + Gumbel noise"):
        rows = rows_of(kind, 8, rng)
        for plan, (programs, spp) in plans.items():
            assert programs * spp >= segments
            within, above, binned, above_row, kth_gap = [], [], [], [], []
            for row in rows:
                m = row.max()
                t, t_row = lane_bounds(row, programs, spp, K)
                edge = m - math.ceil((m - t) * BINS_PER_NAT) / BINS_PER_NAT  # the bins through T's
                within.append(int((row >= m - PRELIST_NATS).sum()))
                above.append(int((row >= t).sum()))
                binned.append(int((row >= edge).sum()))
                above_row.append(int((row >= t_row).sum()))
                kth_gap.append(m - np.sort(row)[-K])
            print(f"{kind:30s} {plan:36s} within 10 nats {np.mean(within):7.0f} | >= T {np.mean(above):5.0f}"
                  f" (bins through T {np.mean(binned):5.0f}) | >= the row's bound {np.mean(above_row):4.0f}"
                  f" | k-th largest {np.mean(kth_gap):4.2f} nats below the max")


if __name__ == "__main__":
    main()
