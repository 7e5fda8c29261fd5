"""Small simulated data frames shared by several test modules."""

import numpy as np
import pandas as pd
from scipy import special


def slope_frame(n_groups, n_per, seed, *, sd=(1.0, 1.0), cor=0.5, beta=(0.3, 1.0, -0.7), hinge=False):
    """Grouped data with correlated random intercepts and slopes of ``x``.

    ``f = beta0 + beta1 x + beta2 z + b0_g + b1_g x``, ``(b0_g, b1_g) ~ N(0, Sigma)``; y is drawn
    from ``P(y = +1) = expit(f)``, or with ``hinge=True`` from the hinge likelihood normalised over
    y, ``exp(-2 (1 - y f)_+) / sum_y' exp(-2 (1 - y' f)_+)``.
    """
    rng = np.random.default_rng(seed)
    S = np.array([[sd[0] ** 2, cor * sd[0] * sd[1]], [cor * sd[0] * sd[1], sd[1] ** 2]])
    b = rng.multivariate_normal(np.zeros(2), S, size=n_groups)
    g = np.repeat(np.arange(n_groups), n_per)
    x, z = rng.normal(size=g.size), rng.normal(size=g.size)
    f = beta[0] + beta[1] * x + beta[2] * z + b[g, 0] + b[g, 1] * x
    if hinge:
        lp, lm = -2 * np.maximum(0, 1 - f), -2 * np.maximum(0, 1 + f)
        p = np.exp(lp - np.logaddexp(lp, lm))
    else:
        p = special.expit(f)
    y = np.where(rng.random(g.size) < p, 1, 0)
    h = rng.integers(0, 3, g.size)
    return pd.DataFrame({"y": y, "x": x, "z": z, "g": [f"g{k:03d}" for k in g], "h": [f"h{k}" for k in h]})


def mixed_frame(n=60, seed=0):
    """``n`` rows of a numeric ``x``, a positive ``z``, a two-level ``s``, a three-level group ``g``
    and a 0/1 response ``y`` driven by ``x``: every kind of column a saved fit records."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"x": rng.normal(size=n), "z": rng.uniform(1, 2, n), "s": rng.choice(["a", "b"], n),
                       "g": rng.choice(list("pqr"), n)})
    df["y"] = (df["x"] + rng.normal(size=n) > 0).astype(int)
    return df


def site_frame(n, seed, n_sites, site_sd=0.0):
    """Four numeric predictors of different scales and offsets, a site factor of ``n_sites``
    levels, a two-level ``sex``, and a yes/no label from a noisy linear score (plus a site effect
    ``N(0, site_sd^2)`` where ``site_sd`` > 0): the frames the Dask tests compare with pandas."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(rng.standard_normal((n, 4)) * [1.0, 3.0, 0.5, 10.0] + [0.0, 5.0, -2.0, 100.0],
                      columns=["x1", "x2", "x3", "x4"])
    df["site"] = rng.choice([f"s{i:02d}" for i in range(n_sites)], n)
    df["sex"] = rng.choice(["m", "f"], n)
    u = rng.normal(0, site_sd, n_sites)[df["site"].str[1:].astype(int)] if site_sd > 0 else 0.0
    f = df.x1 - 0.3 * (df.x2 - 5) + 0.8 * (df.sex == "m") + u + rng.standard_normal(n)
    df["y"] = np.where(f > 0, "yes", "no")
    return df


def relative_error(a, b):
    """Largest ``|a - b| / |b|`` over the entries."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))
