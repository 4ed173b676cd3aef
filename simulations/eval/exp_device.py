"""Experiment 7: the longitudinal protocols at equal *device-level* ε — and what equal *value-level* ε costs.

A deployment states one number per device and budget window: the ``device`` privacy unit's bound on the whole
transcript of the window (edge_agent's default, docs/agent.md). This experiment gives every protocol the same such
budget B over a window of T reports and measures the per-round frequency error (raw, unbiased; MSE over items and
rounds) on two kinds of data:

* **volatile** — Syn (k = 360; the value changes in most rounds);
* **slow** — a slowly changing categorical dimension: each device starts from its Adult ``V7`` (occupation, k = 14)
  value and, in each round, with probability 1/T redraws it from the Adult marginal (≈ 1 change per window; devices
  with more changes exist and are not excluded).

How each protocol is set to cost exactly B over the window (``device_epsilon`` of :mod:`protocols.longitudinal`,
the charge the agent's ledger records):

* a fresh oracle every round (GRR, OUE): ε = B/T per report (T charges of B/T);
* a fresh oracle once per window at ε = B, devices assigned to the window's rounds by a public rotation (device i
  reports in round i mod T: a data-independent schedule, so the loss is one report's B) — each round hears n/T devices;
* a memoized two-stage chain (L-GRR, L-OSUE, BiLOLOHA, OLOLOHA) at α = ε1/ε∞ = 1/2 would need T ·
  ``irr_input_epsilon`` = B (the device-unit charge: memoization buys nothing under this unit). At a fixed α the
  IRR's ε for an arbitrary input change does **not** tend to 0 with ε∞ (a noisier PRR needs a sharper IRR to keep
  ε1 = α·ε∞): it has a floor (ln 3 for LOLOHA with g = 2, ≈ ln(k−1) for L-GRR, ≈ k·ln 3 for L-OSUE), so the chains
  are reported by their smallest possible charge per window and are not configurable below it. With α free, the
  best chain under this unit is no PRR at all — the fresh oracle;
* DDRM-k (the agent's ``ddrm`` stream) with a declared number of changes c: ε per node = B / ``device_epsilon``(T)
  at ε = 1, i.e. B / min((2c+1)·levels, k·nodes) — it does not grow with T once the tree is large.

At equal *value-level* ε (the ``value`` unit, RAPPOR-style memoization: ε∞ per memo entry, what experiment 4
compares), the memoized protocols' per-round error is shown next to the device-level ε the same configuration
really costs over the window (T · ``irr_input_epsilon``; ∞ without an IRR) — the gap the value unit leaves open.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar

from protocols.frequency import GRR, OUE
from protocols.longitudinal import LGRR, LOLOHA, LOSUE, CategoricalDDRM, DBitFlipPM, LongitudinalProtocol
from simulations.datasets import SYN_K, load_adult
from simulations.eval.common import EvalConfig, Figure, Panel, Section, Stat, Table, fmt_float, panel_plot
from simulations.eval.common import progress, series_of, summarise

NAME = "device"
TITLE = "7. Longitudinal protocols at equal device-level ε (and what equal value-level ε costs)"
HORIZON = 64
QUICK_HORIZON = 16
BUDGETS = (1.0, 4.0, 16.0)
QUICK_BUDGETS = (4.0,)
VALUE_EPSILONS = (1.0, 4.0)
QUICK_VALUE_EPSILONS = (1.0,)
QUICK_USERS = 1_000
DDRM_CHANGES = (1, 4)
SLOW_COLUMN = "V7"  # Adult's occupation (k = 14)
ALPHA = 0.5  # ε1 / ε∞ of the two-stage chains, as in experiment 4
CHAINS = ("L-GRR", "L-OSUE", "BiLOLOHA", "OLOLOHA")
ROTATING = "once per window at ε = B (rotating rounds)"


def _chain(label: str, eps_inf: float, k: int) -> LongitudinalProtocol:
    e1 = ALPHA * eps_inf
    if label == "L-GRR":
        return LGRR(eps_inf, e1, k)
    if label == "L-OSUE":
        return LOSUE(eps_inf, e1, k)
    if label == "BiLOLOHA":
        return LOLOHA.bi(eps_inf, e1, k)
    return LOLOHA.optimal(eps_inf, e1, k)


def chain_charge_floor(label: str, k: int) -> tuple[float, float]:
    """(min over ε∞ of the chain's per-report device charge ``irr_input_epsilon`` at α = 1/2, the ε∞ attaining it):
    a grid over ε∞ ∈ [10⁻⁴, 50] refined by bounded minimisation (configurations the chain rejects are skipped)."""
    def charge(e: float) -> float:
        try:
            return _chain(label, e, k).irr_input_epsilon
        except ValueError:
            return math.inf

    grid = np.logspace(-4, math.log10(50.0), 121)
    values = np.array([charge(e) for e in grid])
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    res = minimize_scalar(charge, bounds=(lo, hi), method="bounded", options={"xatol": 1e-9})
    return (float(res.fun), float(res.x)) if res.fun < values[i] else (float(values[i]), float(grid[i]))


def ddrm_at_device_budget(budget: float, horizon: int, k: int, changes: int) -> CategoricalDDRM:
    """DDRM-k whose exact device charge over a whole tree of ``horizon`` reports is ``budget``."""
    unit = CategoricalDDRM(1.0, k, horizon, changes).device_epsilon(horizon)
    return CategoricalDDRM(budget / unit, k, horizon, changes)


def ddrm_crossover(budget: float, k: int, changes: int = 1, max_log2: int = 40) -> int | None:
    """The smallest window T = 2^j at which DDRM-k's per-round noise variance (every device, ε per node =
    B/((2c+1)·levels), c_D²·mean popcount) falls below the rotation's (n/T devices at ε = B: T · the better of GRR's
    and OUE's per-user variance at f = 0) — both scale as 1/n, so the crossover does not depend on n."""
    oracle = min(GRR(budget, k).variance(0.0), OUE(budget, k).variance(0.0))
    for j in range(1, max_log2 + 1):
        horizon = 1 << j
        levels = horizon.bit_length()
        eps = budget / ((2 * changes + 1) * levels)
        c = (math.exp(eps) + 1) / (math.exp(eps) - 1)
        mean_popcount = (j * (1 << (j - 1)) + 1) / horizon  # popcount summed over t = 1..2^j
        if c**2 * mean_popcount <= horizon * oracle:
            return horizon
    return None


def slow_series(n: int, horizon: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """((n, horizon) codes of Adult's ``V7``, its k): row i starts at Adult row i, redrawn from the marginal with
    probability 1/horizon per round."""
    adult = load_adult()
    col = adult.domain.names.index(SLOW_COLUMN)
    k = int(adult.domain.sizes[col])
    marginal = adult.marginal(col)
    x = np.empty((n, horizon), dtype=np.int64)
    x[:, 0] = adult.data[:n, col]
    for t in range(1, horizon):
        redraw = rng.random(n) < 1.0 / horizon
        x[:, t] = np.where(redraw, rng.choice(k, size=n, p=marginal), x[:, t - 1])
    return x, k


def _truth(values: np.ndarray, k: int) -> np.ndarray:
    return np.stack([np.bincount(values[:, t], minlength=k) / values.shape[0] for t in range(values.shape[1])])


def _run_longitudinal(proto: LongitudinalProtocol, values: np.ndarray, truth: np.ndarray,
                      rng: np.random.Generator) -> float:
    fleet = proto.new_fleet(values.shape[0], rng)
    errs = []
    for t in range(values.shape[1]):
        reports, _ = proto.privatize_round(values[:, t], fleet, rng)
        errs.append(np.mean((proto.estimate_round(reports) - truth[t]) ** 2))
    return float(np.mean(errs))


def _run_fresh(oracle: GRR | OUE, values: np.ndarray, truth: np.ndarray, rng: np.random.Generator,
               rotating: bool) -> float:
    n, horizon = values.shape
    errs = []
    for t in range(horizon):
        who = np.arange(t, n, horizon) if rotating else slice(None)
        est = oracle.estimate(oracle.privatize(values[who, t], rng))
        errs.append(np.mean((est - truth[t]) ** 2))
    return float(np.mean(errs))


def _device_protocols(budget: float, horizon: int, k: int) -> dict[str, object]:
    """label → a fresh oracle (with ``rotating``) or a longitudinal protocol, each costing ``budget`` per window."""
    out: dict[str, object] = {
        "GRR every round (ε = B/T)": (GRR(budget / horizon, k), False),
        "OUE every round (ε = B/T)": (OUE(budget / horizon, k), False),
        f"GRR {ROTATING}": (GRR(budget, k), True),
        f"OUE {ROTATING}": (OUE(budget, k), True),
    }
    for c in DDRM_CHANGES:
        out[f"DDRM-k, c = {c} declared changes"] = ddrm_at_device_budget(budget, horizon, k, c)
    return out


def _value_protocols(eps: float, k: int) -> dict[str, LongitudinalProtocol]:
    protos = {label: _chain(label, eps, k) for label in CHAINS}
    protos["dBitFlipPM (b=k, d=k)"] = DBitFlipPM(eps, k, k, k)
    return protos


def run(config: EvalConfig) -> Section:
    horizon = QUICK_HORIZON if config.quick else HORIZON
    budgets = QUICK_BUDGETS if config.quick else BUDGETS
    value_eps = QUICK_VALUE_EPSILONS if config.quick else VALUE_EPSILONS
    reps = 2 if config.quick else max(2, config.reps // 5)
    syn = config.syn()
    n = min(syn.shape[0], QUICK_USERS if config.quick else syn.shape[0])
    data = {
        "volatile": (syn[:n, :horizon], SYN_K),
        "slow": slow_series(n, horizon, config.rng(NAME, "slow")),
    }
    truths = {name: _truth(v, k) for name, (v, k) in data.items()}
    changes = {name: float(np.mean(np.count_nonzero(v[:, 1:] != v[:, :-1], axis=1))) for name, (v, _) in data.items()}

    acc: dict[tuple[str, str, float], list[float]] = {}
    grid = [(name, b, rep) for name in data for b in budgets for rep in range(reps)]
    for name, budget, rep in progress(grid, config, "exp7 device-level ε"):
        values, k = data[name]
        for label, proto in _device_protocols(budget, horizon, k).items():
            rng = config.rng(NAME, name, label, budget, rep)
            if isinstance(proto, tuple):
                mse = _run_fresh(proto[0], values, truths[name], rng, rotating=proto[1])
            else:
                mse = _run_longitudinal(proto, values, truths[name], rng)
            acc.setdefault((name, label, budget), []).append(mse)
    value_acc: dict[tuple[str, str, float], list[float]] = {}
    value_cost: dict[tuple[str, str, float], float] = {}
    vgrid = [(name, e, rep) for name in data for e in value_eps for rep in range(reps)]
    for name, eps, rep in progress(vgrid, config, "exp7 value-level ε"):
        values, k = data[name]
        for label, proto in _value_protocols(eps, k).items():
            mse = _run_longitudinal(proto, values, truths[name], config.rng(NAME, "value", name, label, eps, rep))
            value_acc.setdefault((name, label, eps), []).append(mse)
            value_cost[(name, label, eps)] = horizon * proto.irr_input_epsilon

    mse: dict[str, dict[str, dict[float, Stat]]] = {name: {} for name in data}
    for (name, label, b), vals in acc.items():
        mse[name].setdefault(label, {})[b] = summarise(vals)
    vmse: dict[str, dict[str, dict[float, Stat]]] = {name: {} for name in data}
    for (name, label, e), vals in value_acc.items():
        vmse[name].setdefault(label, {})[e] = summarise(vals)
    uniform = {name: float(np.mean((1.0 / k - truths[name]) ** 2)) for name, (_, k) in data.items()}

    table = Table(
        f"Per-round frequency MSE (raw, unbiased) at equal device-level budget B per window of T = {horizon} reports "
        f"(n = {n}; mean ± std over {reps} repetitions)",
        ["data", "protocol", *(f"B = {b:g}" for b in budgets)],
    )
    for name in data:
        for label, by_b in mse[name].items():
            table.add(name, label, *(by_b[b].fmt() for b in budgets))
        table.add(name, "uniform guess 1/k (uses no data)", *(fmt_float(uniform[name]) for _ in budgets))
    vtable = Table(
        f"At equal value-level ε∞ (value unit: ε∞ per memo entry; chains ε1 = ε∞/2): per-round MSE, and the "
        f"device-level ε the same configuration costs over T = {horizon} reports",
        ["data", "protocol", *(f"ε∞ = {e:g}: MSE" for e in value_eps), *(f"ε∞ = {e:g}: device ε" for e in value_eps)],
    )
    for name in data:
        for label, by_e in vmse[name].items():
            vtable.add(name, label, *(by_e[e].fmt() for e in value_eps),
                       *(fmt_float(value_cost[(name, label, e)]) if math.isfinite(value_cost[(name, label, e)])
                         else "∞ (no IRR)" for e in value_eps))

    panels = [Panel(list(budgets), series_of(mse[name], list(budgets)), "device-level budget B per window",
                    "per-round MSE", f"{name} data (mean changes per device per window: {changes[name]:.1f})",
                    logx=True, reference={"uniform guess 1/k": [uniform[name]] * len(budgets)})
              for name in data]
    panel_plot(config.img_dir / "exp7_device_level.png", panels, ncols=2)

    best: dict[tuple[str, float], str] = {}
    findings = []
    for name in data:
        for b in budgets:
            stats = {label: by_b[b] for label, by_b in mse[name].items()}
            best[(name, b)] = min(stats, key=lambda lab: stats[lab].mean)
            runner_up = sorted(stats, key=lambda lab: stats[lab].mean)[1]
            findings.append(
                f"{name} data, B = {b:g}: lowest {best[(name, b)]} ({fmt_float(stats[best[(name, b)]].mean)}), "
                f"then {runner_up} ({fmt_float(stats[runner_up].mean)}); a fresh OUE every round "
                f"{fmt_float(stats['OUE every round (ε = B/T)'].mean)}; uniform guess {fmt_float(uniform[name])}."
            )
    floors = {(name, label): chain_charge_floor(label, k) for name, (_, k) in data.items() for label in CHAINS}
    ftable = Table(
        f"Memoized chains under the device unit (α = 1/2): the smallest per-report charge any ε∞ gives, and the "
        f"smallest budget per window of T = {horizon} reports they can be configured for",
        ["data", "chain", "min charge per report", "at ε∞", f"min B per window (T = {horizon})",
         f"fits B = {max(budgets):g}?"],
    )
    for (name, label), (floor, at) in floors.items():
        at_text = "→ 0 (infimum)" if at <= 1.0001e-4 else fmt_float(at)
        ftable.add(name, label, fmt_float(floor), at_text, fmt_float(horizon * floor),
                   "yes" if horizon * floor <= max(budgets) else "no")
    cheapest_chain = min(floors, key=lambda key: floors[key][0])
    findings.append(
        f"No memoized chain at α = 1/2 fits any of these budgets: the cheapest, {cheapest_chain[1]} on the "
        f"{cheapest_chain[0]} data, costs at least {fmt_float(floors[cheapest_chain][0])} per report "
        f"({fmt_float(horizon * floors[cheapest_chain][0])} per window) under the device unit, against B/T = "
        f"{fmt_float(max(budgets) / horizon)} for the largest budget here. A memo hit is charged like a fresh "
        "report, and the permanent randomization only adds noise: under the device unit the best chain is none."
    )
    for name in data:
        e = value_eps[0]
        costs = {lab: value_cost[(name, lab, e)] for lab in vmse[name]}
        finite = {lab: c for lab, c in costs.items() if math.isfinite(c)}
        findings.append(
            f"{name} data, value-level ε∞ = {e:g}: the same configurations cost, at the device level over T = "
            f"{horizon} reports, " + ", ".join(f"{lab} {fmt_float(c)}" for lab, c in finite.items())
            + (", dBitFlipPM ∞ (no IRR)" if len(finite) < len(costs) else "")
            + " — the value unit's ε∞ says nothing about when values change."
        )
    crossover = {(name, b): ddrm_crossover(b, k) for name, (_, k) in data.items() for b in budgets}
    winners = {name: sorted({best[(name, b)] for b in budgets}) for name in data}
    cross_text = "; ".join(
        f"{name} (k = {k}): " + ", ".join(
            f"B = {b:g} from T ≈ {crossover[(name, b)]:,}" if crossover[(name, b)] else f"B = {b:g} never below 2^40"
            for b in budgets)
        for name, (_, k) in data.items())
    def lower(a: str, b: str) -> bool:
        return all(mse[name][a][bb].mean < mse[name][b][bb].mean for name in data for bb in budgets)

    rot_vs_split = lower(f"OUE {ROTATING}", "OUE every round (ε = B/T)")
    rot_vs_ddrm = all(any(lower(f"{o} {ROTATING}", f"DDRM-k, c = {c} declared changes") for o in ("OUE", "GRR"))
                      for c in DDRM_CHANGES)
    findings.append(
        "Which to pick, from these measurements. Lowest per-round error at every budget: "
        + "; ".join(f"{name} data: {', '.join(w)}" for name, w in winners.items())
        + ". One report per device per window at the full budget, spread over the rounds by a public schedule, "
        + ("beats" if rot_vs_split else "does not always beat")
        + " splitting the budget over the rounds (variance ∝ T instead of T²) and "
        + ("beats" if rot_vs_ddrm else "does not always beat") + f" DDRM-k at T = {horizon}. "
        "DDRM-k (the agent's `ddrm` stream) hears every device every round at a cost set by the changes, not the "
        "rounds; by the exact variances (both ∝ 1/n) it overtakes the rotation for c = 1 only for long windows — "
        f"{cross_text} reports per window — e.g. per-second sampling under a daily budget, or fleets too small to "
        "split (n/T devices per round). Memoized chains are for the `value` unit only, where an operator accepts "
        "that change times are revealed; their ε∞ is never the device-level number."
    )
    setup = f"""
Every protocol gets the **same device-level budget B per window of T = {horizon} reports** (B ∈
{{{', '.join(f'{b:g}' for b in budgets)}}}): the bound of the `device` unit (edge_agent's default) on everything one
device releases in the window. Fresh oracles spend B/T per round, or B once per window with devices rotating over
the rounds (device i reports in round i mod T, a public schedule); memoized chains (α = 1/2) would need
T·`irr_input_epsilon` = B (memo hits are not free under this unit) and are shown by the smallest charge they can
have (third table); DDRM-k has ε per node = B / min((2c+1)·levels,
k·nodes) for c ∈ {{{', '.join(str(c) for c in DDRM_CHANGES)}}} declared changes. Data: **volatile** = Syn (k =
{SYN_K}, {changes['volatile']:.1f} changes per device per window on average) and **slow** = Adult `{SLOW_COLUMN}`
(k = {data['slow'][1]}) redrawn from its marginal with probability 1/T per round ({changes['slow']:.2f} changes per
device per window on average). n = {n} devices, {reps} repetitions. The second table compares the memoized
protocols at equal **value-level** ε∞ (what experiment 4 does) and shows the device-level ε that configuration
really costs.
"""
    headline = [
        "At equal device-level ε per window of T = " + str(horizon) + " reports: lowest per-round frequency error "
        + "; ".join(f"{name}: " + ", ".join(f"B = {b:g} {best[(name, b)]}" for b in budgets) for name in data)
        + f". No memoized chain (α = 1/2) can be configured below {fmt_float(horizon * floors[cheapest_chain][0])} "
        "per window under the device unit.",
    ]
    return Section(NAME, TITLE, setup, tables=[table, ftable, vtable], headline=headline,
                   figures=[Figure("exp7_device_level.png",
                                   "Experiment 7: per-round frequency MSE versus the device-level budget per window, "
                                   "volatile (Syn) and slow (Adult V7) data.")],
                   findings=findings,
                   data={"mse": mse, "value_mse": vmse, "value_cost": value_cost, "best": best, "uniform": uniform,
                         "changes": changes, "floors": floors, "crossover": crossover})
