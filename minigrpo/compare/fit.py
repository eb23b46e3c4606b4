"""Beside the table: ScaleRL's fit of a learning curve (Khatri et al. 2025, arXiv 2510.13786). In: one run's
(or a variant's mean) held-out accuracy against steps, with the accuracy at step 0. Out: the sigmoid

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

fitted by least squares: its asymptote A (where the run would end), its efficiency B (how steeply it gets
there), its midpoint C_mid (the steps to half the gain), and the fit's RMS error. R0 is the accuracy at
step 0, held fixed as ScaleRL holds it, and A at most 1: a curve still climbing at its last step would
otherwise extrapolate to an accuracy above 100%. B is held in [0.1, 20]: a flat curve is fitted as well
by any midpoint and an ever steeper step there. Departure: ScaleRL fits against GPU-hours; this fits
against steps (every run of a comparison has the same batch). A grid over (B, C_mid) with A in closed
form starts Levenberg-Marquardt, in numpy (no scipy). It knows numbers, not runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STEEPNESS = (float(np.log(0.1)), float(np.log(20.0)))  # log B's range


@dataclass(frozen=True)
class SigmoidFit:
    A: float  # the asymptote: the accuracy the curve tends to
    B: float  # the efficiency: the steepness in log-steps
    C_mid: float  # the midpoint: steps to half of A - R0
    rms: float  # root mean square of the residuals over the fitted points
    R0: float  # the accuracy at step 0, held fixed


def sigmoid(steps, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
    """R(C) at each step (step 0 is R0)."""
    steps = np.asarray(steps, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        u = (C_mid / steps) ** B  # inf at step 0: R0
    return R0 + (A - R0) / (1.0 + u)


def fit_sigmoid(steps, accuracy, R0: float) -> SigmoidFit | None:
    """The least-squares fit of A, B and C_mid to the points with steps > 0; None with fewer than 3."""
    C = np.asarray(steps, dtype=np.float64)
    R = np.asarray(accuracy, dtype=np.float64)
    keep = C > 0
    C, R = C[keep], R[keep]
    if len(C) < 3:
        return None
    bounds = np.log([C.min() / 10, C.max() * 10])  # C_mid's range: beyond it A is not told apart
    ceiling = 1.0 - R0  # A - R0 at most: A is an accuracy
    theta = _grid_start(C, R - R0, bounds, ceiling)
    theta = _levenberg_marquardt(C, R - R0, theta, bounds, ceiling)
    A_gain, log_B, log_mid = theta
    residuals = R0 + A_gain * _share(C, log_B, log_mid) - R
    return SigmoidFit(
        float(R0 + A_gain),
        float(np.exp(log_B)),
        float(np.exp(log_mid)),
        float(np.sqrt(np.mean(residuals**2))),
        R0,
    )


def _share(C: np.ndarray, log_B: float, log_mid: float) -> np.ndarray:
    """1 / (1 + (C_mid / C)^B): the share of A - R0 reached at each step."""
    return 1.0 / (1.0 + np.exp(np.exp(log_B) * (log_mid - np.log(C))))


def _grid_start(C: np.ndarray, gain: np.ndarray, bounds, ceiling: float) -> np.ndarray:
    """(A - R0, log B, log C_mid) of the best point of a grid, A - R0 in closed form for each (B, C_mid)
    (the least-squares value, or the ceiling where that lies above it: the error is a parabola in it)."""
    best, start = np.inf, None
    for log_B in np.linspace(np.log(0.2), np.log(10.0), 40):
        for log_mid in np.linspace(bounds[0], bounds[1], 60):
            s = _share(C, log_B, log_mid)
            A_gain = min(float(s @ gain / (s @ s)), ceiling)
            error = float(np.sum((A_gain * s - gain) ** 2))
            if error < best:
                best, start = error, np.array([A_gain, log_B, log_mid])
    return start


def _levenberg_marquardt(C, gain, theta, bounds, ceiling: float, iterations: int = 200) -> np.ndarray:
    """Refine (A - R0, log B, log C_mid) by damped Gauss-Newton steps on the analytic Jacobian; C_mid stays
    inside `bounds`, A - R0 at most `ceiling`."""
    damping = 1e-3

    def error(t) -> float:
        return float(np.sum((t[0] * _share(C, t[1], t[2]) - gain) ** 2))

    current = error(theta)
    for _ in range(iterations):
        A_gain, log_B, log_mid = theta
        s = _share(C, log_B, log_mid)
        u = (1.0 - s) / s  # (C_mid / C)^B
        B = np.exp(log_B)
        ds = -s * s * u * B  # d s / d log C_mid
        jacobian = np.stack([s, A_gain * ds * (log_mid - np.log(C)), A_gain * ds], axis=1)  # (N, 3)
        residual = A_gain * s - gain  # (N,)
        normal = jacobian.T @ jacobian
        step = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -jacobian.T @ residual)
        trial = theta + step
        trial[0] = min(trial[0], ceiling)
        trial[1] = np.clip(trial[1], *STEEPNESS)
        trial[2] = np.clip(trial[2], *bounds)
        trial_error = error(trial)
        if trial_error < current:
            theta, current, damping = trial, trial_error, damping / 3
            if np.max(np.abs(step)) < 1e-10:
                break
        else:
            damping *= 10
            if damping > 1e10:
                break
    return theta
