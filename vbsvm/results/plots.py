"""Plots: inclusion probabilities of Laplace-zero fits and ELBO traces of VB fits.

Every function returns a :class:`matplotlib.figure.Figure` (or draws into ``ax`` and returns its
figure); nothing is shown or saved.
"""

from __future__ import annotations

import numpy as np

from vbsvm.exceptions import InputError

__all__ = ["plot_inclusion", "plot_inclusion_comparison", "plot_elbo"]


def _figure(ax, figsize):
    from matplotlib.figure import Figure

    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _inclusion_table(obj):
    if hasattr(obj, "inclusion"):
        return obj.inclusion()
    cols = {"p_include"}
    if not cols.issubset(getattr(obj, "columns", [])):
        raise InputError("expected a SelectionFit or the DataFrame of fit.inclusion() (with a 'p_include' column).")
    return obj


def plot_inclusion(table, ax=None, *, shade="p_positive_if_included", order=None, title=None,
                   positive_label="+1", threshold=0.5, figsize=None):
    """Bar chart of inclusion probabilities, like Luts & Ormerod (2014), Figure 3.

    Parameters
    ----------
    table : SelectionFit or pandas.DataFrame
        A fit, or the DataFrame returned by ``fit.inclusion()``.
    ax : matplotlib.axes.Axes, optional
        Draw into this axes (default: a new figure).
    shade : str or None
        Column giving the grey level of each bar: 0 white (negative association) to 1 black
        (positive association). Default ``"p_positive_if_included"``, the paper's
        ``P(v_k > 0 | y)``; ``None`` for plain bars.
    order : sequence of str, optional
        Order of the bars (default: decreasing ``p_include``).
    title : str, optional
    positive_label : str
        Name of the ``+1`` response level, for the colour-bar label.
    threshold : float or None
        Dashed horizontal line (the median-probability-model cut, 0.5).
    figsize : tuple, optional

    Returns
    -------
    matplotlib.figure.Figure
    """
    import matplotlib
    from matplotlib import cm, colors

    table = _inclusion_table(table)
    if order is not None:
        table = table.loc[list(order)]
    k = len(table)
    fig, ax = _figure(ax, figsize or (max(6.0, 0.17 * k + 2.0), 3.6))
    x = np.arange(k)
    cmap = matplotlib.colormaps["Greys"]
    if shade is not None:
        level = np.nan_to_num(table[shade].to_numpy(dtype=float), nan=0.5)
        face = cmap(level)
    else:
        face = "0.5"
    ax.bar(x, table["p_include"].to_numpy(dtype=float), width=0.8, color=face, edgecolor="black", linewidth=0.5)
    ax.set_xticks(x)
    ax.set_xticklabels([str(i) for i in table.index], rotation=90, fontsize=7)
    ax.set_xlim(-0.7, k - 0.3)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("P(included | y)")
    if threshold is not None:
        ax.axhline(threshold, color="0.4", lw=0.8, ls="--")
    if title:
        ax.set_title(title)
    if shade is not None:
        sm = cm.ScalarMappable(norm=colors.Normalize(0, 1), cmap=cmap)
        cb = fig.colorbar(sm, ax=ax, pad=0.01, fraction=0.03)
        cb.set_label(f"P(coef > 0 | included)\n(dark: more {positive_label})", fontsize=7)
    return fig


def plot_inclusion_comparison(fits, labels=None, *, order=None, positive_label="+1", figsize=None):
    """Inclusion bar charts of several fits (e.g. VB and Gibbs) stacked, bars in the same order.

    Parameters
    ----------
    fits : sequence of SelectionFit or DataFrame
    labels : sequence of str, optional
        Panel titles (default ``"VB"``/``"Gibbs"`` from each fit's method).
    order : sequence of str, optional
        Bar order (default: decreasing ``p_include`` of the first fit).
    positive_label : str
        Name of the ``+1`` level for the colour bar (taken from the fits when they are fits).

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.figure import Figure

    tables = [_inclusion_table(f) for f in fits]
    if labels is None:
        labels = [{"vb": "VB", "gibbs": "Gibbs"}.get(getattr(f, "method", ""), f"fit {i + 1}")
                  for i, f in enumerate(fits)]
    if order is None:
        order = list(tables[0].index)
    k = len(order)
    fig = Figure(figsize=figsize or (max(6.0, 0.17 * k + 2.0), 3.0 * len(tables)), layout="constrained")
    axes = fig.subplots(len(tables), 1, squeeze=False)[:, 0]
    positive = next((str(f.design.positive_level) for f in fits if hasattr(f, "design")), positive_label)
    for ax, t, lab in zip(axes, tables, labels):
        plot_inclusion(t, ax=ax, order=order, title=lab, positive_label=positive)
    return fig


def plot_elbo(fit, ax=None, *, figsize=(5.0, 3.2)):
    """ELBO trace of a VB fit (one point per accepted iterate), with the final value marked.

    Parameters
    ----------
    fit : vbsvm fit with an ``elbo`` attribute (``method="vb"``)

    Returns
    -------
    matplotlib.figure.Figure
    """
    elbo = getattr(fit, "elbo", None)
    if elbo is None:
        raise InputError("plot_elbo needs a VB fit (method='vb'); this fit has no ELBO trace.")
    elbo = np.asarray(elbo, dtype=float)
    fig, ax = _figure(ax, figsize)
    ax.plot(np.arange(elbo.size), elbo, marker=".", lw=1)
    ax.axhline(elbo[-1], color="0.5", lw=0.8, ls=":")
    ax.set_xlabel("iteration (accepted iterates)")
    ax.set_ylabel("ELBO")
    if elbo.size > 3:
        lo = np.quantile(elbo, 0.1)
        ax.set_ylim(lo - 0.05 * (elbo[-1] - lo + 1e-12), elbo[-1] + 0.05 * (elbo[-1] - lo + 1e-12))
    return fig
