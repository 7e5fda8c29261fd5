"""The fitted-model object of the Bayesian SVM with missing predictors imputed in the model
(``vbsvm.svm(..., missing="impute")``; see :mod:`vbsvm.models.missing`).

:class:`ImputedFit` is a :class:`~vbsvm.results.fit.Fit` with the imputation blocks added:

* :attr:`ImputedFit.imputed`: one row per missing cell (row label, design column, posterior mean,
  sd and an interval), on the original scale of the **design column**: a predictor entered as
  ``np.log(choleste)`` is imputed and reported as ``np.log(choleste)``; a predictor in
  interactions (``x * z``) is imputed and reported as the predictor ``x``, its design columns
  ``x``, ``x:z`` being linear in it (see :mod:`vbsvm.models.missing`, *Interactions*);
* :meth:`ImputedFit.to_arviz`: the posterior group also holds ``x_missing`` (dim
  ``missing_cell``), ``mu`` (dim ``imp_col``) and ``Sigma`` (dims ``imp_col``, ``imp_col_bis``);
* :meth:`ImputedFit.predict` accepts rows with missing predictors: the score is integrated over
  the conditional distribution of the missing entries given the observed ones under the fitted
  imputation model (Gibbs: per draw of ``(beta, mu, Sigma)``; VB: with ``E_q[mu]`` and the
  precision ``E_q[Sigma^{-1}]`` that the VB imputations themselves use); a missing predictor
  in an interaction enters the score linearly, ``theta^T (a + S^T x_M)``, with the row's slopes
  ``S`` (e.g. ``beta_x + beta_xz z`` for ``x * z``);
* :meth:`ImputedFit.summary` adds the missing-data counts and the imputation model.

Stored quantities (``fit.posterior``), all on the original scale of the design columns:
VB: ``x_missing_mean``, ``x_missing_sd``, ``x_missing_rowcov`` (each incomplete row's covariance
block, padded), ``mu_mean``, ``mu_cov``, ``Sigma_scale``, ``Sigma_df`` (``q(Sigma) = IW``);
Gibbs: ``x_missing_draws``, ``mu_draws``, ``Sigma_draws``.
"""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

import numpy as np
import pandas as pd
import xarray as xr
from scipy import sparse

from vbsvm.models.missing import imputation_spec
from vbsvm.posterior.imputation import imputation_posterior_of
from vbsvm.posterior.representations import add_sparse_score
from vbsvm.results.fit import Fit, interval_names

__all__ = ["ImputedFit"]

#: Value of the root attribute ``vbsvm_fit_type`` written by :meth:`ImputedFit.to_arviz`.
FIT_TYPE = "imputed"


class _NewRows(NamedTuple):
    """What :meth:`ImputedFit._new_rows` passes to the score methods besides the dense rows: the
    eliminated term's ``(codes, Z)`` and the rows' imputation variables and design entries
    (:class:`~vbsvm.models.missing.Completion`, original scale)."""

    sc: object
    completion: object



class ImputedFit(Fit):
    """A Bayesian SVM fitted with ``missing="impute"`` (see :func:`vbsvm.svm`).

    Everything :class:`~vbsvm.results.fit.Fit` offers, plus :attr:`imputed`, the imputation-model
    parameters in :meth:`to_arviz`, and predictions for rows with missing predictors.
    """

    #: posterior key of the Gibbs draws of the label effect (conditional model); its name without
    #: ``_draws`` is the variable of :meth:`to_arviz`
    _label_effect_key = "gamma_draws"

    # ------------------------------------------------------------------ bookkeeping
    @cached_property
    def _spec(self):
        """The imputation variables (:func:`vbsvm.models.missing.imputation_spec`)."""

        return imputation_spec(self.design)

    @property
    def imputation_columns(self) -> list:
        """Names of the variables in the imputation model: every non-intercept design column,
        except that a predictor entering interactions (``x * z``) is one variable named after
        the predictor, whose design columns are linear in it."""
        return list(self._spec.names)

    def _completion(self, frame):
        """Imputation variables and design entries of ``frame``'s missing cells, original scale."""
        X = self.design.new_X(frame, allow_missing=True, standardized=False)
        return self._spec.completion(self.design, frame, X, standardized=False)

    @cached_property
    def _train_mask(self) -> np.ndarray:
        """Which imputation variables are missing in each training row (n x d)."""
        return self._completion(self.design.raw).mask

    def _cells(self):
        """Row and imputation-variable index of each missing cell (row-major order)."""
        return np.nonzero(self._train_mask)

    @property
    def n_incomplete(self) -> int:
        """Number of training rows with at least one missing predictor."""
        return int(self._train_mask.any(axis=1).sum())

    # ------------------------------------------------------------------ imputations
    @property
    def imputed(self) -> pd.DataFrame:
        """Posterior of every missing cell: ``row`` (the data's index label), ``column`` (design
        column, e.g. ``np.log(choleste)``: values are on that transformed scale), ``mean``,
        ``sd`` and a 95% interval (Gibbs: equal-tailed posterior quantiles; VB: the Gaussian
        q-interval, typically too narrow)."""
        return self.imputed_table()

    def imputed_table(self, level=None) -> pd.DataFrame:
        """:attr:`imputed` at another interval ``level``."""
        level = self._level(level)
        rows, cols = self._cells()
        names = np.array(self.imputation_columns, dtype=object)
        lo_name, hi_name = interval_names(level)
        mean, sd, lo, hi = self._imp.cell_marginals(level)
        return pd.DataFrame({"row": np.asarray(self.design.row_labels)[rows], "column": names[cols],
                             "mean": mean, "sd": sd, lo_name: lo, hi_name: hi})

    def imputation_model(self) -> pd.DataFrame:
        """Posterior means of the imputation model ``d_i ~ N(mu, Sigma)`` on the original
        scale of the design columns: ``n_missing``, ``mu`` (mean and sd) and ``sd(d)`` =
        ``sqrt(Sigma_jj)``, and the correlations implied by ``E[Sigma]``."""
        mu_draws, Sigma_draws = self._imp.parameters()
        mean_mu, sd_mu, Sigma = mu_draws[0], mu_draws[1], Sigma_draws
        names = self.imputation_columns
        n_missing = self._train_mask.sum(axis=0)
        sd = np.sqrt(np.diag(Sigma))
        table = pd.DataFrame({"n_missing": n_missing.astype(int), "mu": mean_mu, "sd(mu)": sd_mu,
                              "sd(d)": sd}, index=pd.Index(names, name="column"))
        gamma = self._label_effect()
        if gamma is not None:
            table.insert(3, "gamma", gamma[0])
            table.insert(4, "sd(gamma)", gamma[1])
        corr = Sigma / np.outer(sd, sd)
        for j, name in enumerate(names):
            table[f"corr[{j + 1}]"] = corr[:, j]
        return table

    @property
    def conditional(self) -> bool:
        """True for the conditional (cut) imputation model, False for the paper's joint model."""
        return self.info.get("imputation", {}).get("model", "joint") == "conditional"

    def _label_effect(self):
        """Posterior mean and sd of the label effect ``gamma`` (conditional model; else None)."""
        return self._imp.label_effect() if self.conditional else None

    # ------------------------------------------------------------------ summary
    def summary_tables(self, level) -> list:
        """The missing-data section of :meth:`summary`: counts and the imputation model."""
        base = list(self.info.get("summary_tables", []))
        table = self.imputation_model()
        keep = ["n_missing", "mu", "sd(mu)"] + (["gamma", "sd(gamma)"] if self.conditional else []) + ["sd(d)"]
        law = "d | y ~ N(mu + y gamma, Sigma)" if self.conditional else "d ~ N(mu, Sigma)"
        return base + [(f"Imputation model {law}: {self.n_incomplete} incomplete rows, "
                        f"{int(table['n_missing'].sum())} missing cells", table[keep])]

    def _imputation_notes(self) -> list:
        """Notes of :meth:`summary` (stored in ``info["summary_notes"]`` when the fit is made)."""
        imp = self.info.get("imputation", {})
        d = self._spec.d
        Psi = np.asarray(imp.get("Psi", 0.01 * np.eye(d)))
        psi_txt = (f"{Psi[0, 0]:g} I" if np.allclose(Psi, Psi[0, 0] * np.eye(d)) else "Psi (user matrix)")
        counts = ", ".join(f"{name}: {int(k)}" for name, k in
                           zip(self.imputation_columns, self._train_mask.sum(0))
                           if k)
        txt = [
            f"Missing predictors imputed in the model (MCAR assumed): {self.n_incomplete} of {self.n_obs} "
            f"rows incomplete; missing cells per column: {counts or 'none'}.",
            "Imputation model on the " + ("standardized " if self.settings.get("standardize", True) else "")
            + "design columns "
            f"({', '.join(self.imputation_columns)}): "
            + ("d_i | y_i ~ N(m_{y_i}, Sigma) (mu = mean of the class means m_-1, m_+1, gamma = half their "
               f"difference), m_c ~ N(0, {imp.get('sigma2_mu', 1e8):g} I), " if self.conditional else
               f"d_i ~ N(mu, Sigma), mu ~ N(0, {imp.get('sigma2_mu', 1e8):g} I), ")
            + f"Sigma ~ IW({psi_txt}, {imp.get('nu', 3):g})"
            + ("" if imp.get("prior_proper", True) else
               f" (improper since nu <= d - 1 = {d - 1}; its normalizing constant is left out of the ELBO)")
            + ". Transformed predictors are imputed on the transformed scale (the design column)"
            + ("; predictors in interactions (" + ", ".join(v for v in self._spec.variables if v is not None)
               + ") on their own scale, their design columns computed from the imputations."
               if any(v is not None for v in self._spec.variables) else "."),
        ]
        if self.conditional:
            txt.append("Cut model (imputation='conditional'): the imputations come from this model given the "
                       "observed predictors and the label, without feedback from the SVM; "
                       + self._imp.pooling_text(self.info))
        else:
            txt.append("Caution: the SVM pseudo-likelihood is not normalized in y, so this joint model (the "
                       "paper's, imputation='joint') draws each imputation toward the side of its row's label and "
                       "inflates the coefficients of imputed columns (measured 1.44x VB, 1.55x Gibbs on x1 in "
                       "benchmarks/imputation_simulation.py); the default imputation='conditional' does not.")
        return txt

    def _description_lines(self) -> list:
        """``repr(fit)``: how many rows had their missing predictors imputed."""
        return super()._description_lines() + [
            f"Missing predictors imputed in the model: {self.n_incomplete} of {self.n_obs} rows incomplete"]

    # ------------------------------------------------------------------ draws and ArviZ
    @property
    def _imp(self):
        """The imputation block's posterior object
        (:func:`vbsvm.posterior.imputation.imputation_posterior_of`)."""
        return self._cached("imputation_posterior", imputation_posterior_of)

    def _imputation_draws(self):
        """Draws of ``x_missing`` (chain, draw, cell), ``mu`` (chain, draw, d) and ``Sigma``
        (chain, draw, d, d): Gibbs draws, or iid draws from the VB q."""
        return self._imp.draws()

    def _cell_labels(self):
        rows, cols = self._cells()
        labels = np.asarray(self.design.row_labels)[rows]
        names = np.array(self.imputation_columns, dtype=object)[cols]
        return [f"{r}, {c}" for r, c in zip(labels, names)], labels, names

    def _posterior_dataset(self) -> xr.Dataset:
        ds = super()._posterior_dataset()
        x, mu, Sigma = self._imputation_draws()
        cell_labels, labels, names = self._cell_labels()
        imp = list(self.imputation_columns)
        row_coord = labels if np.asarray(labels).dtype.kind in "iu" else np.asarray([str(v) for v in labels], dtype=object)
        ds = ds.assign({
            "x_missing": (("chain", "draw", "missing_cell"), x),
            "mu": (("chain", "draw", "imp_col"), mu),
            "Sigma": (("chain", "draw", "imp_col", "imp_col_bis"), Sigma),
        })
        if self.conditional:
            ds = ds.assign({self._label_effect_key.removesuffix("_draws"):
                            (("chain", "draw", "imp_col"), self._imp.label_effect_draws(mu.shape[:2]))})
        return ds.assign_coords({
            "missing_cell": np.asarray(cell_labels, dtype=object),
            "missing_row": ("missing_cell", row_coord),
            "missing_column": ("missing_cell", np.asarray(names, dtype=object)),
            "imp_col": np.asarray(imp, dtype=object), "imp_col_bis": np.asarray(imp, dtype=object),
        })

    def to_arviz(self, log_likelihood=True):
        """The fit as an :class:`xarray.DataTree` in ArviZ 1.x layout.

        As :meth:`vbsvm.results.fit.Fit.to_arviz`, with ``x_missing`` (dim ``missing_cell``, labelled
        ``"<row>, <column>"`` with coordinates ``missing_row`` and ``missing_column``; original
        scale of the design column), ``mu`` (dim ``imp_col``) and ``Sigma`` (dims ``imp_col``,
        ``imp_col_bis``) in the posterior group. The root attribute ``vbsvm_fit_type`` is
        ``"imputed"``.
        """
        dt = super().to_arviz(log_likelihood=log_likelihood)
        if "log_likelihood" in dt.children:
            dt["log_likelihood"].attrs["imputations"] = "incomplete rows completed with each draw's imputations"
        dt.attrs["vbsvm_fit_type"] = FIT_TYPE
        post = dt["posterior"]
        attrs = dict(post.attrs)
        attrs["imputation_model"] = (("d_i | y_i ~ N(mu + y_i gamma, Sigma), cut from the SVM" if self.conditional
                                      else "d_i ~ N(mu, Sigma)")
                                     + " on the non-intercept design columns (a predictor in interactions: the "
                                     "predictor); values on the original scale of each design column (transformed "
                                     "predictors on the transformed scale)")
        attrs.update(self._imp.arviz_attrs())
        post.attrs = attrs
        return dt

    def _train_scores(self) -> np.ndarray:
        """Scores of the training rows under each draw, ``(chains, draws, n)``, the incomplete rows
        completed with the same draw's imputations (Gibbs draws, or iid draws from q): what the
        ``log_likelihood`` group of :meth:`to_arviz` and :meth:`loo` use."""

        theta = self._draws()[0]
        x = self._imputation_draws()[0]
        dense, (sc, comp) = self._new_rows(self.design.raw, new_levels="zero")
        nd = self.layout.n_dense
        F = np.stack([add_sparse_score(t[:, :nd] @ dense.T, t[:, nd:], sc) for t in theta])
        # every design entry of a missing cell is e_off + e_slope x (dense holds e_off): add the
        # coefficient times e_slope x, summed by row
        E = comp.e_cell.size
        if E:  # (no design entry of a missing cell when the training rows were complete)
            to_rows = sparse.csr_matrix((np.ones(E), (comp.e_row, np.arange(E))), shape=(dense.shape[0], E))
            contrib = theta[..., comp.e_col] * comp.e_slope * x[..., comp.e_cell]
            F += (to_rows @ contrib.reshape(-1, E).T).T.reshape(F.shape)
        return F

    def _compute_diagnostics(self) -> pd.DataFrame:
        """R-hat, bulk/tail ESS and MCSE of every parameter, including ``x_missing``, ``mu``
        and every entry of ``Sigma`` (variables with several dimensions are named
        ``Sigma[a, b]``); :meth:`diagnostics` caches it (Gibbs only)."""
        from arviz_stats import ess, mcse, rhat

        post = self._posterior_dataset()
        results = {"r_hat": rhat(post), "ess_bulk": ess(post, method="bulk"),
                   "ess_tail": ess(post, method="tail"), "mcse_mean": mcse(post)}
        names = []
        cols = {k: [] for k in results}
        for var in post.data_vars:
            da = post[var]
            extra = [dim for dim in da.dims if dim not in ("chain", "draw")]
            if extra:
                index = pd.MultiIndex.from_product([post[dim].values for dim in extra]) if len(extra) > 1 else None
                if index is None:
                    names.extend(f"{var}[{c}]" for c in da[extra[0]].values)
                else:
                    names.extend(f"{var}[{', '.join(str(x) for x in t)}]" for t in index)
            else:
                names.append(var)
            for k, value in results.items():
                v = value[var]
                if extra:
                    v = v.transpose(*extra)
                cols[k].extend(np.atleast_1d(np.asarray(v.values)).ravel().tolist())
        return pd.DataFrame(cols, index=pd.Index(names, name="parameter"))

    # ------------------------------------------------------------------ prediction
    def _new_rows(self, newdata, allow_missing=True, new_levels="zero"):
        """As :meth:`Fit._new_rows`, with every entry that depends on a missing cell at its value
        for the cell 0 (``e_off``; the entry is ``e_off + e_slope x``) and, in place of the
        eliminated term's ``(codes, Z)``, a :class:`_NewRows` that adds the rows'
        :class:`~vbsvm.models.missing.Completion`."""
        dense, sc = super()._new_rows(newdata, allow_missing=allow_missing, new_levels=new_levels)
        comp = self._completion(newdata)
        comp.fill(dense, 0.0)
        return dense, _NewRows(sc, comp)

    @staticmethod
    def _patterns(comp):
        """Groups of rows sharing a missingness pattern among the imputation variables."""
        nan = comp.mask
        rows = np.flatnonzero(nan.any(axis=1))
        if rows.size == 0:
            return []
        uniq, inverse = np.unique(nan[rows], axis=0, return_inverse=True)
        inverse = np.asarray(inverse).ravel()
        return [(rows[inverse == k], np.flatnonzero(pat), np.flatnonzero(~pat)) for k, pat in enumerate(uniq)]

    def _score_moments(self, dense, sc):
        """Mean and sd of the score of new rows.

        Rows with missing predictors: the score is integrated over the distribution of the
        missing entries given the observed ones under the fitted imputation model (Gibbs:
        exactly, as a mixture over the draws of ``(beta, mu, Sigma)``; VB: with the q-means of
        the means and the precision ``E_q[Sigma^{-1}]`` that the VB imputations themselves use,
        the mean and variance of the score being exact under q for that plug-in).

        The conditional model (``imputation="conditional"``) imputes given the label, which is
        unknown at prediction time; its role is marginalised: ``p(x_M | x_O) = sum_c
        p(c | x_O) N(x_M; E(x_M | x_O, c), Var(x_M | x_O))``, with ``p(c | x_O) proportional to
        pi_c N(x_O; m_{c,O}, Sigma_OO)`` and ``pi_c`` the class proportions of the training
        data (the label's marginal). The score's mean and variance are those of this mixture.
        """
        return self._imp.score_moments(self, dense, sc)

    def _prob_positive(self, newdata, new_levels, mean, sd):
        """``P(f(x) > 0 | data)``, incomplete rows integrated over the imputation model: under VB
        ``Phi(m / s)`` of the score's moments, under Gibbs the mixture over the draws."""
        dense, rows = self._new_rows(newdata, new_levels="zero" if new_levels == "integrate" else new_levels)
        return self._imp.prob_positive(self, dense, rows, mean, sd)

    def _class_log_prior(self) -> np.ndarray:
        """log of the training class proportions (classes -1, +1), the label's marginal."""
        y = np.asarray(self.design.y, dtype=float)
        return np.log(np.array([np.mean(y < 0), np.mean(y > 0)]))

    def _components(self, mu, gamma):
        """Label mixture components ``[(log pi_c, mean_c)]``: one component of weight 1 for the
        joint model (``gamma is None``), classes -1 and +1 with means ``mu -/+ gamma`` otherwise."""
        if gamma is None:
            return [(0.0, mu)]
        lp = self._class_log_prior()
        return [(lp[0], mu - gamma), (lp[1], mu + gamma)]

    @staticmethod
    def _mixture(logw, values):
        """Normalised weights (over the first axis) of the label components and their weighted
        mean and (between-component) variance of ``values``."""
        W = np.exp(logw - logw.max(axis=0))
        W /= W.sum(axis=0)
        mean = np.sum(W * values, axis=0)
        return W, mean, np.sum(W * values ** 2, axis=0) - mean ** 2
