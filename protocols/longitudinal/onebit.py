"""1BitMean with α-point rounding, memoization per grid point and output perturbation (Ding, Kulkarni & Yekhanin,
"Collecting telemetry data privately", NeurIPS 2017, §3), SPEC §3.11 and §2.2.

Values x ∈ [0, m]. The grid has s cells of width step = m/s (points 0, step, ..., m). Each device draws
u ~ U[0, 1) once, for life, and rounds with α = u·step: with L the grid point at or below x and R = L + step,
y = L if x + α < R else R, so E_α[y] = x and Var_α(y) = (R - x)(x - L).
PRR (memoized per grid point y): b = 1 w.p. π(y) = 1/(e^ε+1) + (y/m)(e^ε-1)/(e^ε+1) — 1BitMean, ε-LDP.
Output perturbation (fresh): the sent bit is b flipped w.p. γ ∈ [0, 1/2), so one report is ε1-LDP with
ε1 = ln(ρ_max/ρ_min), ρ_max = γ + (1-2γ)e^ε/(e^ε+1), ρ_min = 1 - ρ_max (ε1 = ε when γ = 0).
Server: b̃ = (r - γ)/(1 - 2γ) is unbiased for π(y); the mean is x̂ = (m/n) Σ (b̃(e^ε+1) - 1)/(e^ε-1).
Per-user variance at x: E_y[m² c² ρ(y)(1-ρ(y))/(1-2γ)²] + (R - x)(x - L), c = (e^ε+1)/(e^ε-1),
ρ(y) = γ + (1-2γ)π(y). Spend ≤ (#grid points used)·ε ≤ (s+1)·ε (SPEC §4).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from protocols.base import check_epsilon, check_int
from protocols.longitudinal.base import FleetState, MemoizedClient, MemoizedProtocol
from protocols.longitudinal.prf import prf_uniform

__all__ = ["OneBitMeanMemo", "OneBitMeanClient", "alpha_round_index"]

_STREAM_PRR = 601


def alpha_round_index(x: Any, u: Any, step: float, s: int) -> np.ndarray:
    """Grid index of the α-point rounding of x (α = u·step): i_L if x + α < (i_L+1)·step else i_L + 1, in [0, s]."""
    x = np.asarray(x, dtype=float)
    i_low = np.clip(np.floor(x / step), 0, s).astype(np.int64)
    right = (i_low + 1) * step
    up = (x + np.asarray(u, dtype=float) * step >= right) & (i_low < s)
    return i_low + up


class OneBitMeanMemo(MemoizedProtocol):
    """Memoized 1BitMean on [0, m] with s grid cells and output-perturbation flip probability γ ∈ [0, 1/2)."""

    name = "1BitMean-memo"

    def __init__(self, epsilon: float, m: float = 1.0, s: int = 16, gamma: float = 0.0) -> None:
        self.epsilon_inf = check_epsilon(epsilon)
        try:
            self.m = float(m)
            self.gamma = float(gamma)
        except (TypeError, ValueError):
            raise ValueError("m and gamma must be real numbers") from None
        if not (math.isfinite(self.m) and self.m > 0):
            raise ValueError(f"m must be a finite number > 0, got {m!r}")
        if not (math.isfinite(self.gamma) and 0.0 <= self.gamma < 0.5):
            raise ValueError(f"gamma must lie in [0, 1/2), got {gamma!r}")
        self.s = check_int(s, "s", 1)
        self.step = self.m / self.s
        e = math.exp(self.epsilon_inf)
        rho_max = self.gamma + (1 - 2 * self.gamma) * e / (e + 1)
        self.epsilon_1 = math.log(rho_max / (1 - rho_max))

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon_inf, "m": self.m, "s": self.s, "gamma": self.gamma}

    @property
    def n_slots(self) -> int:
        return self.s + 1

    @property
    def irr_input_epsilon(self) -> float:
        return math.log((1 - self.gamma) / self.gamma) if self.gamma > 0 else math.inf

    def _check_values(self, values: Any) -> np.ndarray:
        arr = np.asarray(values, dtype=float)
        if arr.size and not np.all(np.isfinite(arr)):
            raise ValueError("values must be finite")
        if arr.size and (arr.min() < 0 or arr.max() > self.m):
            raise ValueError(f"values must lie in [0, {self.m}]; got range [{arr.min():.6g}, {arr.max():.6g}]")
        return arr

    def pi(self, y: Any) -> np.ndarray:
        """π(y) = 1/(e^ε+1) + (y/m)(e^ε-1)/(e^ε+1): P[memoized bit = 1 | grid point y]."""
        e = math.exp(self.epsilon_inf)
        return 1 / (e + 1) + (np.asarray(y, dtype=float) / self.m) * (e - 1) / (e + 1)

    def variance(self, x: Any = 0.0) -> Any:
        """Per-user variance of the mean estimate at input x (divide by n); see module docstring."""
        x = self._check_values(x)
        e = math.exp(self.epsilon_inf)
        c = (e + 1) / (e - 1)
        i_low = np.clip(np.floor(x / self.step), 0, self.s)
        low = i_low * self.step
        high = np.minimum(low + self.step, self.m)
        p_up = np.where(high > low, (x - low) / self.step, 0.0)

        def cond(y: np.ndarray) -> np.ndarray:
            rho = self.gamma + (1 - 2 * self.gamma) * self.pi(y)
            return self.m**2 * c**2 * rho * (1 - rho) / (1 - 2 * self.gamma) ** 2

        out = (1 - p_up) * cond(low) + p_up * cond(high) + (high - x) * (x - low)
        return float(out) if np.ndim(out) == 0 else out

    def memo_slots(self, values: Any, *, u: float | None = None, **device: Any) -> list[int]:
        """Grid indices of a device with rounding offset ``u`` ∈ [0, 1)."""
        if u is None or device or not 0.0 <= float(u) < 1.0:
            raise ValueError("1BitMean memo slots need the device's rounding offset: memo_slots(values, u=...)")
        return [int(i) for i in alpha_round_index(self._check_values(values).ravel(), u, self.step, self.s)]

    def _init_fleet(self, fleet: FleetState, rng: np.random.Generator, **fixed: Any) -> None:
        u = fixed.pop("u", None)
        if fixed:
            raise ValueError(f"unknown fleet parameters {sorted(fixed)}")
        if u is None:
            fleet.aux["u"] = rng.random(fleet.n)
        else:
            arr = np.broadcast_to(np.asarray(u, dtype=float), (fleet.n,)).copy()
            if arr.min() < 0 or arr.max() >= 1:
                raise ValueError("rounding offsets u must lie in [0, 1)")
            fleet.aux["u"] = arr

    def privatize_round(
        self, values: Any, fleet: FleetState, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reports (n,) uint8 bits."""
        x = self._check_fleet_values(values, fleet)
        idx = alpha_round_index(x, fleet.aux["u"], self.step, self.s)
        bit = prf_uniform(fleet.keys, idx, _STREAM_PRR) < self.pi(idx * self.step)
        flip = rng.random(fleet.n) < self.gamma
        fleet.rounds += 1
        return (bit ^ flip).astype(np.uint8), self._charge(fleet, idx)

    def estimate_round(self, reports: Any) -> float:
        r = np.asarray(reports, dtype=float).ravel()
        if r.size == 0:
            raise ValueError("cannot estimate a mean from zero reports")
        if np.any((r != 0) & (r != 1)):
            raise ValueError("1BitMean reports are bits (0 or 1)")
        e = math.exp(self.epsilon_inf)
        b_tilde = (r - self.gamma) / (1 - 2 * self.gamma)
        return float(self.m * np.mean((b_tilde * (e + 1) - 1) / (e - 1)))


class OneBitMeanClient(MemoizedClient):
    """Device side: rounding offset u for life; ``report(x)`` returns one bit (int)."""

    protocol: OneBitMeanMemo

    def __init__(self, protocol: OneBitMeanMemo, *, u: float | None = None, **kwargs: Any) -> None:
        super().__init__(protocol, **kwargs)
        self.u = float(self.rng.random()) if u is None else self._check_u(u)

    @staticmethod
    def _check_u(u: Any) -> float:
        value = float(u)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"rounding offset u must lie in [0, 1), got {u!r}")
        return value

    def _slot(self, value: Any) -> int:
        x = self.protocol._check_values(np.asarray([value], dtype=float))
        return int(alpha_round_index(x, self.u, self.protocol.step, self.protocol.s)[0])

    def _draw_prr(self, slot: int, gen: np.random.Generator) -> int:
        return int(gen.random() < float(self.protocol.pi(slot * self.protocol.step)))

    def _irr(self, prr: int) -> int:
        return int(prr) ^ int(self.rng.random() < self.protocol.gamma)

    def _device_state(self) -> dict[str, Any]:
        return {"u": self.u}

    def _load_device_state(self, state: dict[str, Any]) -> None:
        if set(state) != {"u"}:
            raise ValueError("1BitMean device state must contain exactly 'u'")
        self.u = self._check_u(state["u"])


OneBitMeanMemo.device_parameter = "u"
OneBitMeanMemo.client_class = OneBitMeanClient
