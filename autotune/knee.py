"""Throughput-versus-parallelism curves: the Universal Scalability Law and the 80% rule.

Gunther's USL, X(N) = λN / (1 + σ(N−1) + κN(N−1)), fits measured points far more
steadily than a knee detector on raw points (which moves with the sweep range and the
noise). Its peak is at N* = √((1−σ)/κ). With κ ≈ 0 the curve has no peak: throughput
still rises (or flattens) at the largest parallelism tried, and we say so rather than
extrapolate a peak that was never measured.

The fit uses the standard linearisation N/X = a + b(N−1) + cN(N−1) with a = 1/λ,
b = σ/λ, c = κ/λ (ordinary least squares, σ and κ kept non-negative), which needs no
optimiser and no starting guess. Pure functions; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autotune.results import CurveSummary

HEADROOM = 0.8  # the NeMo Gym guide: "use 80% of peak to leave headroom for stability"
MIN_POINTS_FOR_PEAK = 4  # with 3 points κ interpolates the noise exactly (R² = 1)


@dataclass(frozen=True, slots=True)
class UslFit:
    """λ (throughput of one unit of parallelism), σ (contention), κ (coherency)."""

    lam: float
    sigma: float
    kappa: float
    r2: float

    def throughput(self, n: float) -> float:
        return self.lam * n / (1 + self.sigma * (n - 1) + self.kappa * n * (n - 1))

    @property
    def peak_parallelism(self) -> float | None:
        """N* where the fitted curve peaks; None when it never turns down."""
        if self.kappa <= 1e-12 or self.sigma >= 1:
            return None
        return math.sqrt((1 - self.sigma) / self.kappa)


def fit_usl(parallelism: Sequence[float], throughput: Sequence[float]) -> UslFit:
    """Least-squares USL fit; needs at least two points with positive throughput."""
    points = [(float(n), float(x)) for n, x in zip(parallelism, throughput, strict=True) if x > 0]
    if len(points) < 2:
        raise ValueError("a USL fit needs at least two points with positive throughput")
    n = np.array([p[0] for p in points])
    x = np.array([p[1] for p in points])
    y = n / x
    columns = [np.ones_like(n), n - 1, n * (n - 1)]
    a, b, c = _nonnegative_lstsq(np.stack(columns, axis=1), y, len(points))
    lam = 1 / a
    fit = UslFit(lam=lam, sigma=b * lam, kappa=c * lam, r2=0.0)
    predicted = np.array([fit.throughput(v) for v in n])
    residual = float(np.sum((x - predicted) ** 2))
    total = float(np.sum((x - x.mean()) ** 2))
    return UslFit(fit.lam, fit.sigma, fit.kappa, 1 - residual / total if total > 0 else 1.0)


def _nonnegative_lstsq(design: np.ndarray, y: np.ndarray, count: int) -> tuple[float, float, float]:
    """OLS with b, c ≥ 0 and a > 0: drop a negative coefficient and refit."""
    active = [0, 1, 2] if count >= MIN_POINTS_FOR_PEAK else [0, 1]
    while True:
        solution, *_ = np.linalg.lstsq(design[:, active], y, rcond=None)
        coefficients = dict(zip(active, solution.tolist(), strict=True))
        negative = [i for i in active if i > 0 and coefficients[i] < 0]
        if not negative:
            break
        active.remove(min(negative, key=lambda i: coefficients[i]))
    a = max(coefficients.get(0, 0.0), 1e-12)
    return a, coefficients.get(1, 0.0), coefficients.get(2, 0.0)


def summarise_curve(parallelism: Sequence[int], throughput: Sequence[float]) -> CurveSummary:
    """Everything the recommendation needs from one curve (measured points)."""
    best_index = max(range(len(throughput)), key=lambda i: throughput[i])
    best_n, best_x = int(parallelism[best_index]), float(throughput[best_index])
    largest = max(parallelism)
    try:
        fit = fit_usl(parallelism, throughput)
    except ValueError:
        fit = None
    if fit is None:
        recommended = max(1, math.floor(HEADROOM * best_n))
        return CurveSummary(
            None,
            best_n,
            best_x,
            False,
            best_n,
            best_x,
            recommended,
            best_x,
            best_n,
            best_n,
            "too few points to fit a curve; using measured points",
        )
    fitted_peak = fit.peak_parallelism
    # A peak past the largest parallelism tried was never measured: no extrapolation.
    inside = fitted_peak is not None and fitted_peak <= largest
    if inside and fitted_peak is not None:
        peak_n = fitted_peak
        peak_x = fit.throughput(fitted_peak)
        note = f"throughput peaks at parallelism {fitted_peak:.0f} (fitted)"
    else:
        peak_n, peak_x = float(best_n), max(best_x, fit.throughput(best_n))
        note = (
            f"no peak inside the searched range: the fitted curve does not turn down by "
            f"parallelism {largest} (it rises or levels off); the recommendation uses the "
            f"best measured point (parallelism {best_n}), not an extrapolated peak"
        )
    recommended = max(1, math.floor(HEADROOM * peak_n))
    knee = min(peak_x / fit.lam, peak_n) if fit.lam > 0 else peak_n
    smallest = next(
        (n for n in range(1, math.ceil(peak_n) + 1) if fit.throughput(n) >= HEADROOM * peak_x),
        math.ceil(peak_n),
    )
    return CurveSummary(
        fit={"lambda": fit.lam, "sigma": fit.sigma, "kappa": fit.kappa, "r2": fit.r2},
        peak_parallelism=peak_n,
        peak_throughput=peak_x,
        peak_inside_range=inside,
        best_measured_parallelism=best_n,
        best_measured_throughput=best_x,
        recommended_parallelism=recommended,
        recommended_throughput=fit.throughput(recommended),
        knee_parallelism=knee,
        smallest_parallelism_at_80pct=smallest,
        note=note,
    )
