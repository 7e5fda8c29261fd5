"""The certificates of (non-)separability agree with the linear program wherever they decide.

:func:`vbsvm.formula.separation.separation_certificate` answers True (a separating beta) or False
(an overlap of the classes' convex hulls) only with a certificate that holds by a wide margin, and
None otherwise, for :meth:`~vbsvm.formula.design.Design.linearly_separable`'s LP to settle; here
its answers are compared with the LP's on designs of every kind: overlapping and separable classes,
separations with wide and narrow gaps, more columns than rows, duplicated rows with opposite labels,
duplicated and collinear columns, dummy columns, and columns on very different scales."""

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linprog

import vbsvm
from vbsvm.formula.design import build_design
from vbsvm.formula.separation import _exact_step, separation_certificate


def lp_answer(A):
    """The LP's answer on the rows ``A``: that of its interior-point and dual simplex methods when
    they agree, else the simplex's (a vertex; on narrow separations the interior-point method can
    declare a feasible LP infeasible, see the case "gap 0.0001")."""
    status = [linprog(np.zeros(A.shape[1]), A_ub=-A, b_ub=-np.ones(len(A)), bounds=(None, None),
                      method=method).status for method in ("highs-ipm", "highs-ds")]
    final = status[1] if status[1] in (0, 2) else status[0]
    return final == 0 if final in (0, 2) else None


def designs():
    """``(label, A)`` with ``A = y x`` (an intercept column first) for designs of every kind."""
    rng = np.random.default_rng(20)
    out = []
    for n, p, seed in [(60, 3, 0), (100, 10, 1), (100, 60, 2), (150, 30, 3), (300, 20, 4), (40, 60, 5)]:
        d = build_design("y ~ .", vbsvm.datasets.simulate_luts(n, p, seed=seed))
        out.append((f"luts {n}x{p}", d.y[:, None] * d.X))
        out.append((f"luts {n}x{p} slopes", d.y[:, None] * d.X[:, 1:]))
    for n, p in [(50, 2), (200, 5), (80, 40)]:
        x = rng.standard_normal((n, p))
        out.append((f"random labels {n}x{p}", rng.choice([-1.0, 1.0], n)[:, None] * np.column_stack([np.ones(n), x])))
    for gap in (1.0, 1e-2, 1e-4, 1e-7, 0.0):
        x = rng.standard_normal((400, 3))
        w = np.array([1.0, -2.0, 0.5])
        score = x @ w - 0.3
        keep = np.abs(score) >= gap
        x, y = x[keep], np.where(score[keep] > 0, 1.0, -1.0)
        out.append((f"gap {gap:g}", y[:, None] * np.column_stack([np.ones(len(x)), x])))
    for overlap in (1e-1, 1e-4, 1e-8):  # one line: the classes' intervals overlap by `overlap`
        x = np.sort(rng.uniform(-1.0, 1.0, 300))
        y = np.where(x > 0.1, 1.0, -1.0)
        x[np.flatnonzero(y < 0)[-1]] = x[y > 0].min() + overlap  # the largest negative point
        out.append((f"overlap {overlap:g}", y[:, None] * np.column_stack([np.ones(300), x])))
    x = rng.standard_normal((30, 4))
    X = np.column_stack([np.ones(60), np.vstack([x, x])])
    out.append(("duplicated rows, opposite labels", np.r_[np.ones(30), -np.ones(30)][:, None] * X))
    x = rng.standard_normal((120, 3))
    y = np.where(x[:, 0] + 0.2 * rng.standard_normal(120) > 0, 1.0, -1.0)
    X = np.column_stack([np.ones(120), x, x[:, 0], 2 * x[:, 1] - x[:, 2]])
    out.append(("duplicated and collinear columns", y[:, None] * X))
    X = np.column_stack([np.ones(120), x, x[:, 0] * (1 + 1e-13)])
    out.append(("nearly duplicated columns", y[:, None] * X))
    g = rng.integers(0, 6, 200)
    dummies = (g[:, None] == np.arange(1, 6)).astype(float)
    yg = np.where(rng.random(200) < 0.2 + 0.12 * g, 1.0, -1.0)
    out.append(("dummy columns", yg[:, None] * np.column_stack([np.ones(200), dummies])))
    yg = np.where(g >= 3, 1.0, -1.0)
    out.append(("dummy columns, separated", yg[:, None] * np.column_stack([np.ones(200), dummies])))
    x = rng.standard_normal((150, 3)) * np.array([1e-6, 1.0, 1e6])
    y = np.where(x[:, 0] * 1e6 + x[:, 1] + 1e-6 * x[:, 2] > 0, 1.0, -1.0)
    out.append(("scales 1e-6 to 1e6, separated", y[:, None] * np.column_stack([np.ones(150), x])))
    y[:5] *= -1
    out.append(("scales 1e-6 to 1e6, overlapping", y[:, None] * np.column_stack([np.ones(150), x])))
    return out


CASES = designs()


@pytest.mark.parametrize("label, A", CASES, ids=[c[0] for c in CASES])
def test_the_certificate_gives_the_lps_answer_or_none(label, A):
    found = separation_certificate(A)
    assert found is None or found == lp_answer(A), label


def test_the_certificate_decides_the_usual_designs():
    """Undecided answers fall back on the LP, so only speed is at stake: the simulations and the
    designs with clear answers are all decided."""
    clear = [A for label, A in CASES if label.startswith(("luts", "random", "gap 1,", "gap 1 ", "duplicated rows",
                                                         "dummy"))]
    assert len(clear) >= 15
    assert all(separation_certificate(A) is not None for A in clear)


def test_the_exact_step_minimizes_the_squared_hinge_along_the_step():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        slack, change = rng.standard_normal(n), rng.standard_normal(n)
        change[rng.random(n) < 0.2] = 0.0
        t = _exact_step(slack, change)
        grid = np.linspace(0.0, 3.0 * (t if np.isfinite(t) and t > 0 else 1.0), 2001)
        loss = lambda s: np.sum(np.maximum(slack[None] - s[:, None] * change[None], 0.0) ** 2, axis=1)  # noqa: E731
        assert np.isfinite(t) and t >= 0 or np.all(np.diff(loss(grid)) <= 1e-12)
        if np.isfinite(t):
            assert loss(np.array([t]))[0] <= loss(grid).min() + 1e-10


def test_linearly_separable_answers_as_the_lp_alone(monkeypatch):
    """The design's check with the certificates gives the answers of its LP alone."""
    import vbsvm.formula.design as design_module

    frames = [vbsvm.datasets.simulate_luts(n, p, seed=s) for n, p, s in [(100, 10, 0), (100, 100, 1), (300, 50, 2)]]
    x = np.random.default_rng(4).normal(size=100)
    frames.append(pd.DataFrame({"x": x, "y": (x > 0.8).astype(int)}))
    designs = [build_design("y ~ .", f) for f in frames]
    with_certificates = [(d.linearly_separable(), d.linearly_separable(intercept=False)) for d in designs]
    monkeypatch.setattr(design_module, "separation_certificate", lambda A: None)
    assert with_certificates == [(d.linearly_separable(), d.linearly_separable(intercept=False)) for d in designs]
    assert with_certificates == [(False, False), (True, True), (True, True), (True, False)]
