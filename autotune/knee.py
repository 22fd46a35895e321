"""Throughput-versus-parallelism curves: the Universal Scalability Law, its peak, the 80%
rule for the parallelism to run at, and bootstrap intervals. Pure functions; no I/O.
Why: docs/design/knee.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autotune.results.trials import CurveSummary
from autotune.stats import t95

HEADROOM = 0.8  # the NeMo Gym guide: "use 80% of peak to leave headroom for stability"
MIN_POINTS_FOR_PEAK = 4  # with 3 points κ interpolates the noise exactly (R² = 1)
BOOTSTRAP_DRAWS = 400  # enough for stable 2.5th/97.5th percentiles; fits are microseconds
Z95 = 1.96
MIN_RELATIVE_SE = 0.01  # no probe knows a rate better than ±2% (95%): windows are finite
# A probe's interval is trusted from TRUSTED_BATCHES batch means up (from one or two, a t
# interval is 12.7 or 4.3 standard errors wide and its spread says little); without
# one, a closed-loop rate is taken as known to ±UNKNOWN_SPREAD (seen: ±2%).
TRUSTED_BATCHES = 3
UNKNOWN_SPREAD = 0.05


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


@dataclass(frozen=True, slots=True)
class Landmarks:
    """Where one curve peaks, its knee, and the parallelism to run it at."""

    peak_parallelism: float
    peak_throughput: float
    inside: bool  # the fitted peak lies inside the measured range
    knee_parallelism: float
    recommended_parallelism: int  # 80% of the peak's
    at_ceiling: bool = False  # the curve is level at the server's ceiling: its peak is there


def landmarks(
    fit: UslFit,
    parallelism: Sequence[int],
    throughput: Sequence[float],
    ceiling: int | None = None,
) -> Landmarks:
    """The peak (fitted inside the range, else the best measured point: no extrapolation),
    the knee and the parallelism to run at: 80% of the peak's. Where the curve reached
    the server's `ceiling` (the most requests it runs at once; the caller passes it only
    where the curve is level there: not clearly below its best point) the peak is the
    ceiling: past it requests only wait in the server's queue, so the curve cannot rise
    further, and the peak is known inside the range without a fitted turn."""
    best_index = max(range(len(throughput)), key=lambda i: throughput[i])
    best_n, best_x = int(parallelism[best_index]), float(throughput[best_index])
    fitted_peak = fit.peak_parallelism
    at_ceiling = ceiling is not None and max(parallelism) >= ceiling
    # A peak past the largest parallelism tried was never measured: no extrapolation. At
    # the ceiling a fitted turn below it is the fit bending into the limit: the peak is it.
    inside = at_ceiling or (fitted_peak is not None and fitted_peak <= max(parallelism))
    if at_ceiling and ceiling is not None:
        peak_n, peak_x = float(ceiling), max(best_x, fit.throughput(ceiling))
    elif inside and fitted_peak is not None:
        peak_n, peak_x = fitted_peak, fit.throughput(fitted_peak)
    else:
        peak_n, peak_x = float(best_n), max(best_x, fit.throughput(best_n))
    knee = min(peak_x / fit.lam, peak_n) if fit.lam > 0 else peak_n
    # Below the smallest parallelism measured the fit extrapolates: a curve already level
    # there (a client or a rate limit capping it) has its knee at that point, not at 0.
    knee = max(knee, float(min(parallelism)))
    recommended = max(1, math.floor(HEADROOM * peak_n))
    return Landmarks(peak_n, peak_x, inside, knee, recommended, at_ceiling=at_ceiling)


def summarise_curve(
    parallelism: Sequence[int], throughput: Sequence[float], ceiling: int | None = None
) -> CurveSummary:
    """Everything the recommendation needs from one curve (measured points); `ceiling`:
    the most requests the server runs at once, where the curve's ladder ended level
    (sweep/curve.py decides that from the points' intervals)."""
    best_index = max(range(len(throughput)), key=lambda i: throughput[i])
    best_n, best_x = int(parallelism[best_index]), float(throughput[best_index])
    largest = max(parallelism)
    try:
        fit = fit_usl(parallelism, throughput)
    except ValueError:
        fit = None
    if fit is None:
        at_ceiling = ceiling is not None and max(parallelism) >= ceiling
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
            server_ceiling=ceiling if at_ceiling else None,
        )
    marks = landmarks(fit, parallelism, throughput, ceiling)
    peak_n, peak_x = marks.peak_parallelism, marks.peak_throughput
    if marks.at_ceiling:
        note = (
            f"the curve runs level to the server's ceiling ({ceiling} requests at once): "
            "past it requests only wait in the server's queue, so the peak is there"
        )
    elif marks.inside:
        note = f"throughput peaks at parallelism {peak_n:.0f} (fitted)"
    else:
        note = (
            f"no peak inside the searched range: the fitted curve does not turn down by "
            f"parallelism {largest} (it rises or levels off); the recommendation uses the "
            f"best measured point (parallelism {best_n}), not an extrapolated peak"
        )
    recommended = marks.recommended_parallelism
    lowest = min(parallelism)
    smallest = next(
        (n for n in range(lowest, math.ceil(peak_n) + 1) if fit.throughput(n) >= HEADROOM * peak_x),
        math.ceil(peak_n),
    )
    lowest_x = max(x for n, x in zip(parallelism, throughput, strict=True) if n == lowest)
    if lowest < largest and lowest_x >= HEADROOM * best_x:
        note += (
            f"; already at {lowest_x / best_x:.0%} of the best at the lowest parallelism "
            f"measured ({lowest}): something other than the server's batching (the client, "
            "a rate limit) may cap it from the start"
        )
    return CurveSummary(
        fit={"lambda": fit.lam, "sigma": fit.sigma, "kappa": fit.kappa, "r2": fit.r2},
        peak_parallelism=peak_n,
        peak_throughput=peak_x,
        peak_inside_range=marks.inside,
        best_measured_parallelism=best_n,
        best_measured_throughput=best_x,
        recommended_parallelism=recommended,
        recommended_throughput=fit.throughput(recommended),
        knee_parallelism=marks.knee_parallelism,
        smallest_parallelism_at_80pct=smallest,
        note=note,
        server_ceiling=ceiling if marks.at_ceiling else None,
    )


Interval = tuple[float, float]


@dataclass(frozen=True, slots=True)
class CurveBootstrap:
    """The refitted curves of every bootstrap draw, and the 95% intervals they give."""

    fits: list[UslFit]
    draws: list[Landmarks]

    def interval(self, values: Sequence[float], censored: Sequence[bool] = ()) -> Interval:
        """The 2.5th and 97.5th percentiles of one figure over the draws. A draw whose
        peak lies past the range measured only bounds the figure from below (`censored`):
        where more than 2.5% of the draws are, the interval has no upper end (inf)."""
        low, high = np.percentile(np.array(values, dtype=float), [2.5, 97.5])
        if censored and sum(censored) > 0.025 * len(censored):
            high = math.inf
        return float(low), float(high)

    def _past_range(self) -> list[bool]:
        return [not d.inside for d in self.draws]

    @property
    def recommended_parallelism(self) -> Interval:
        """Open above where draws put the peak past the range."""
        return self.interval([d.recommended_parallelism for d in self.draws], self._past_range())

    @property
    def peak_parallelism(self) -> Interval:
        return self.interval([d.peak_parallelism for d in self.draws], self._past_range())

    @property
    def peak_throughput(self) -> Interval:
        """Not open above: past the range the curve has flattened, and its throughput
        there is what the top rungs measured."""
        return self.interval([d.peak_throughput for d in self.draws])

    @property
    def knee_parallelism(self) -> Interval:
        """A knee at a peak past the range is as unbounded as the peak."""
        at_peak = [not d.inside and d.knee_parallelism >= d.peak_parallelism for d in self.draws]
        return self.interval([d.knee_parallelism for d in self.draws], at_peak)

    def throughput_at(self, parallelism: float) -> Interval:
        """The fitted throughput's 95% interval at one parallelism (a prediction)."""
        return self.interval([fit.throughput(parallelism) for fit in self.fits])


def standard_errors(
    parallelism: Sequence[int],
    throughput: Sequence[float],
    intervals: Sequence[Interval | None],
    batches: Sequence[int | None],
) -> list[float]:
    """Each point's standard error: from its probe's 95% interval (a t interval over
    `batches` batch means) if trusted, else ±UNKNOWN_SPREAD; never below what the fit's
    misses show (a curve the USL fits loosely is known less well than its probes say)
    nor below MIN_RELATIVE_SE."""
    misses = 0.0
    try:
        fit = fit_usl(parallelism, throughput)
    except ValueError:
        fit = None
    free = len(parallelism) - 3
    if fit is not None and free > 0:
        relative = [
            (x - fit.throughput(n)) / x for n, x in zip(parallelism, throughput, strict=True)
        ]
        misses = math.sqrt(sum(r * r for r in relative) / free)
    errors = []
    for x, interval, count in zip(throughput, intervals, batches, strict=True):
        from_probe = UNKNOWN_SPREAD / Z95 * x
        if interval is not None and count is not None and count >= TRUSTED_BATCHES:
            from_probe = (interval[1] - interval[0]) / (2 * t95(count - 1))
        errors.append(max(from_probe, misses * x, MIN_RELATIVE_SE * x))
    return errors


def bootstrap_curve(
    parallelism: Sequence[int],
    throughput: Sequence[float],
    errors: Sequence[float],
    *,
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = 0,
    ceiling: int | None = None,
) -> CurveBootstrap | None:
    """Refit the curve `draws` times, each point drawn from N(measured, error²); None when
    there are too few points to fit. `ceiling`: as for `landmarks`."""
    if len(parallelism) < 2:
        return None
    rng = np.random.default_rng(seed)
    x = np.array(throughput, dtype=float)
    spread = np.array(errors, dtype=float)
    fits: list[UslFit] = []
    marks: list[Landmarks] = []
    for _ in range(draws):
        drawn = np.maximum(x + rng.standard_normal(len(x)) * spread, 1e-9 * x.max()).tolist()
        try:
            fit = fit_usl(parallelism, drawn)
        except ValueError:
            continue
        fits.append(fit)
        marks.append(landmarks(fit, parallelism, drawn, ceiling))
    return CurveBootstrap(fits, marks) if fits else None
