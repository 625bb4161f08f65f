"""The statistics a canary analysis compares two versions with: how far apart two class
distributions are (PSI, Jensen–Shannon distance), whether two samples of values come from
one distribution (two-sample Kolmogorov–Smirnov), and a latency quantile read from a
Prometheus-style cumulative histogram.

Pure numpy (SciPy is not a dependency): each function states what it computes and the
thresholds conventionally read from it, so a setting in canary_analysis can say what its
default means.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from serving import contract

# Below this the alternating series of the Kolmogorov survival function converges slowly,
# so the CDF's own (theta-function) series is summed instead; both are exact to double
# precision within a few terms on their side of the switch.
_KOLMOGOROV_SWITCH = 1.18
_KOLMOGOROV_TERMS = 100


def psi(expected_counts: Sequence[float], actual_counts: Sequence[float], epsilon: float = 1e-4) -> float:
    """Population stability index of ``actual`` against ``expected`` class counts:
    ``sum((a_i - e_i) * ln(a_i / e_i))`` over class shares.

    Each share is smoothed as ``(share + epsilon) / (1 + k * epsilon)`` (k classes), so a
    class empty on one side adds a large but finite term instead of infinity. The shorter
    vector is padded with zeros (a class one side never saw). Symmetric in its arguments,
    0 for equal shares.

    Conventional reading: below 0.1 no significant shift, 0.1–0.25 a moderate shift worth
    a look, above 0.25 a significant shift. Raises ValueError for a side with no counts
    or a negative count.
    """
    expected, actual = _aligned_shares(expected_counts, actual_counts)
    k = len(expected)
    expected = (expected + epsilon) / (1 + k * epsilon)
    actual = (actual + epsilon) / (1 + k * epsilon)
    return float(np.sum((actual - expected) * np.log(actual / expected)))


def js_distance(p_counts: Sequence[float], q_counts: Sequence[float]) -> float:
    """Jensen–Shannon distance between two class distributions given as counts: the
    square root of the Jensen–Shannon divergence in base 2, so it lies in [0, 1] — 0 for
    equal shares, 1 for distributions with no class in common. Symmetric, and a true
    metric (unlike PSI it needs no smoothing: empty classes contribute 0).

    Conventional reading: below about 0.1 the distributions are close; above about 0.3
    they differ clearly. Raises ValueError for a side with no counts or a negative count.
    """
    p, q = _aligned_shares(p_counts, q_counts)
    middle = (p + q) / 2
    divergence = (_kullback_leibler_bits(p, middle) + _kullback_leibler_bits(q, middle)) / 2
    # Rounding can leave a hair below 0 or above 1.
    return math.sqrt(min(max(divergence, 0.0), 1.0))


def excess_proportion_p(a_hits: int, a_total: int, b_hits: int, b_total: int) -> float:
    """One-sided two-proportion z-test (pooled): the p-value of "a's rate is above b's"
    arising by chance when both rates are equal. 1 when neither side has a hit (nothing to
    test) or a's rate is not above b's; asymptotic, like the chi-square test."""
    if a_total <= 0 or b_total <= 0:
        raise ValueError("each side needs at least one observation")
    pooled = (a_hits + b_hits) / (a_total + b_total)
    if pooled in (0.0, 1.0):
        return 1.0
    z = (a_hits / a_total - b_hits / b_total) / math.sqrt(pooled * (1 - pooled) * (1 / a_total + 1 / b_total))
    return 0.5 * math.erfc(z / math.sqrt(2))


def chi_square_homogeneity(a_counts: Sequence[float], b_counts: Sequence[float]) -> tuple[float, int, float]:
    """Pearson's chi-square test that two samples of classes come from one distribution:
    (statistic, degrees of freedom, p-value) over the classes either side has (a class
    neither side has carries no evidence). p is exact for the chi-square distribution
    (the regularised upper incomplete gamma function), the test itself asymptotic: with
    expected counts below about 5 it is rough, which is why the analysis waits for
    ``min_requests`` first. Equal distributions give p near 1; it is the sampling noise
    that PSI alone cannot tell from a shift at small counts."""
    length = max(len(a_counts), len(b_counts))
    a, b = (_shares(counts, length, side) * float(np.sum(np.asarray(counts, dtype=float)))
            for counts, side in ((a_counts, "first"), (b_counts, "second")))
    seen = (a + b) > 0
    a, b = a[seen], b[seen]
    total_a, total_b = a.sum(), b.sum()  # both above 0: _shares refuses an empty side
    dof = int(seen.sum()) - 1
    if dof < 1:
        return 0.0, 0, 1.0
    column = a + b
    expected_a, expected_b = column * total_a / (total_a + total_b), column * total_b / (total_a + total_b)
    statistic = float(np.sum((a - expected_a) ** 2 / expected_a) + np.sum((b - expected_b) ** 2 / expected_b))
    return statistic, dof, chi_square_survival(statistic, dof)


def chi_square_survival(statistic: float, dof: int) -> float:
    """P(X ≥ statistic) for X ~ chi-square with ``dof`` degrees of freedom."""
    if statistic <= 0:
        return 1.0
    return _upper_gamma_regularised(dof / 2.0, statistic / 2.0)


def _upper_gamma_regularised(a: float, x: float) -> float:
    """Q(a, x), by the series below a + 1 and Lentz's continued fraction above (Numerical
    Recipes' gammq), to about 1e-12."""
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        for n in range(1, 500):
            term *= x / (a + n)
            total += term
            if abs(term) < abs(total) * 1e-14:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    tiny = 1e-300
    b, c, d = x + 1.0 - a, 1.0 / tiny, 1.0 / (x + 1.0 - a)
    fraction = d
    for n in range(1, 500):
        an = -n * (n - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        step = d * c
        fraction *= step
        if abs(step - 1.0) < 1e-14:
            break
    return min(1.0, math.exp(log_prefix) * fraction)


def ks_two_sample(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Two-sample Kolmogorov–Smirnov test: the statistic D, the largest distance between
    the two empirical CDFs (0 for identical samples, 1 for samples that do not overlap),
    and its asymptotic two-sided p-value ``Q((en + 0.12 + 0.11 / en) * D)`` with
    ``en = sqrt(n * m / (n + m))`` (Stephens' effective-n correction, as in Numerical
    Recipes' ``kstwo``), where Q is the Kolmogorov survival function.

    Conventional reading: p below 0.05 (or the stricter 0.01) rejects "same distribution".
    With large samples a tiny, harmless D is significant, so D itself should also pass an
    effect-size limit (0.1–0.2 is a common choice) before calling two samples different.
    Raises ValueError for an empty sample or a non-finite value.
    """
    first, second = _finite_sample(a, "a"), _finite_sample(b, "b")
    statistic = _ks_statistic(first, second)
    n, m = len(first), len(second)
    effective_n = math.sqrt(n * m / (n + m))
    return statistic, kolmogorov_survival((effective_n + 0.12 + 0.11 / effective_n) * statistic)


def kolmogorov_survival(x: float) -> float:
    """P(K > x) for the Kolmogorov distribution K (the limit of sqrt(n) * D):
    ``2 * sum((-1)^(j-1) * exp(-2 j^2 x^2))``, and for small x the complement of
    ``sqrt(2 pi) / x * sum(exp(-(2j-1)^2 pi^2 / (8 x^2)))``. Its conventional critical
    values: 1.36 at 5 %, 1.63 at 1 %."""
    if x <= 0:
        return 1.0
    j = np.arange(1, _KOLMOGOROV_TERMS + 1)
    if x < _KOLMOGOROV_SWITCH:
        cdf = math.sqrt(2 * math.pi) / x * float(np.sum(np.exp(-((2 * j - 1) ** 2) * math.pi**2 / (8 * x * x))))
        return min(max(1.0 - cdf, 0.0), 1.0)
    signs = np.where(j % 2 == 1, 1.0, -1.0)
    return min(max(2.0 * float(np.sum(signs * np.exp(-2.0 * j * j * x * x))), 0.0), 1.0)


def histogram_quantile(cumulative_buckets: Mapping[str, int], q: float) -> float | None:
    """The q-quantile (0 ≤ q ≤ 1), in the buckets' unit (seconds for latency), of a
    cumulative histogram ``{"<upper bound>": count of observations ≤ bound, ..., "+Inf":
    total}`` — the way Prometheus' ``histogram_quantile`` reads it: find the bucket holding
    rank ``q * total`` and interpolate linearly inside it (the first bucket starts at 0).
    A quantile that falls in the +Inf bucket answers the highest finite bound, since
    nothing better is known. Counts that dip (a merge of uneven reports) are raised to
    their running maximum first, as Prometheus does.

    None when there is nothing to read: no observations, no "+Inf" bucket, or no finite
    bound.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be from 0 to 1, got {q}")
    bounds = [float(bound) for bound in cumulative_buckets]
    if len(bounds) < 2 or max(bounds) != math.inf:
        return None
    return contract.histogram_quantile(cumulative_buckets, q)  # the worker's reports read theirs so too


def _aligned_shares(first: Sequence[float], second: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    length = max(len(first), len(second))
    return _shares(first, length, "first"), _shares(second, length, "second")


def _shares(counts: Sequence[float], length: int, side: str) -> np.ndarray:
    padded = np.zeros(length)
    padded[: len(counts)] = np.asarray(counts, dtype=float)
    if np.any(padded < 0) or not np.all(np.isfinite(padded)):
        raise ValueError(f"{side} counts must be finite and not negative")
    total = padded.sum()
    if total <= 0:
        raise ValueError(f"{side} counts are empty: a distribution needs at least one observation")
    return padded / total


def _kullback_leibler_bits(p: np.ndarray, q: np.ndarray) -> float:
    present = p > 0  # 0 * log 0 = 0; q > 0 wherever p > 0, since q is a mixture with p
    return float(np.sum(p[present] * np.log2(p[present] / q[present])))


def _finite_sample(values: Sequence[float], side: str) -> np.ndarray:
    sample = np.asarray(values, dtype=float)
    if sample.size == 0:
        raise ValueError(f"sample {side} is empty")
    if not np.all(np.isfinite(sample)):
        raise ValueError(f"sample {side} has non-finite values")
    return np.sort(sample)


def _ks_statistic(first: np.ndarray, second: np.ndarray) -> float:
    # Both empirical CDFs evaluated at every observed value: the largest gap is at one.
    points = np.concatenate([first, second])
    cdf_first = np.searchsorted(first, points, side="right") / len(first)
    cdf_second = np.searchsorted(second, points, side="right") / len(second)
    return float(np.max(np.abs(cdf_first - cdf_second)))
