"""How many candidates sampling by descent takes per row, by simulation on the CPU (NumPy):

    python benchmarks/descent_steps.py [DRAWS]

The descent (``kernels.descent_kernel``) races the row, keeps the winner c when the mass before c
in the composite order (logit descending, then index) is below p times the row's mass, and else
races the tokens before c. This replays that rule with Gumbel noise on gpu_sampling's logits
(151936 Gaussian logits, standard deviation 4 "peaked" and 2 "flat", plus a nearly uniform row)
and prints, per top-p: the mean, 99th percentile and largest number of candidates, and the share
of rows whose finishing program must pass over the row, alone and in a batch of 64 (where the
call waits for its slowest row). Round r (1 .. R) sums the mass before candidate r and races
candidate r + 1, so a row of more than R = DESCENT_ROUNDS (the library's) candidates needs the
finishing passes (one per candidate after the R-th). Run with the library on the path (the
repository's environment, or PYTHONPATH=src).
"""
import sys

import numpy as np

from treefold._ops.sampling import DESCENT_ROUNDS

VOCAB = 151936
SCALES = {"peaked (sd 4)": 4.0, "flat (sd 2)": 2.0, "uniform": 1e-4}
TOP_P = (0.95, 0.9, 0.5, 0.1, 0.01, 1e-4)


def candidates(y: np.ndarray, mass_before: np.ndarray, p: float, rng: np.random.Generator) -> int:
    """Candidates one draw takes: y in the composite order, mass_before its exclusive prefix sums
    of the probabilities."""
    scores = y - np.log(rng.exponential(size=y.size))  # y + Gumbel noise
    end, steps = y.size, 0
    while True:
        c = int(np.argmax(scores[:end]))  # the first of equal scores: the lowest position
        steps += 1
        if mass_before[c] < p:
            return steps
        end = c


def main(draws: int) -> None:
    rng = np.random.default_rng(0)
    print(f"{'logits':14s} {'top-p':>7s} {'mean':>5s} {'p99':>4s} {'max':>4s} "
          f"{'finish, 1 row':>14s} {'finish, 64 rows':>16s}")
    for name, scale in SCALES.items():
        y = np.sort(rng.standard_normal(VOCAB) * scale)[::-1]
        probs = np.exp(y - y[0])
        probs /= probs.sum()
        mass_before = np.cumsum(probs) - probs
        for p in TOP_P:
            steps = np.array([candidates(y, mass_before, p, rng) for _ in range(draws)])
            finish = float(np.mean(steps > DESCENT_ROUNDS))
            print(f"{name:14s} {p:7g} {steps.mean():5.2f} {np.percentile(steps, 99):4.0f} {steps.max():4d} "
                  f"{finish:14.3f} {1 - (1 - finish) ** 64:16.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400)
