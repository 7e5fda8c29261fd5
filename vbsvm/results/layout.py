"""Where each coefficient of a linear fit sits in its vector theta = (fixed effects, random
effects), and the JSON form of that layout kept in fit files."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["ThetaLayout"]


@dataclass
class ThetaLayout:
    """Where each coefficient sits in the vector theta = (fixed effects, random intercepts).

    Attributes
    ----------
    fixed : list of str
        Names of the fixed effects (the first ``len(fixed)`` coordinates).
    groups : dict
        Grouping-factor name -> (levels, coordinate indices).
    n_dense : int
        Number of coordinates handled densely (fixed effects and the smaller factors).
    sparse_group : str or None
        The factor eliminated by the Schur complement (its coordinates come last).
    variances : list of str
        Names of the inferred variance components, e.g. ``["sigma2_u", "sigma2_patient_id"]``.
    re_columns : dict
        Random-effect term name -> its column names (``["Intercept", "time"]``); a term's
        coordinates are ordered level by level (``l q + j``). Absent terms: ``["Intercept"]``.
    covariances : list of str
        Names of the terms with a q x q covariance (q > 1 columns), in the model's order.
    """

    fixed: list
    groups: dict
    n_dense: int
    sparse_group: str | None
    variances: list
    re_columns: dict = field(default_factory=dict)
    covariances: list = field(default_factory=list)

    @classmethod
    def from_model(cls, model, design, variances=None) -> "ThetaLayout":
        """The layout of a :class:`~vbsvm.models.linear.LinearSVMModel` built from ``design``."""
        groups = {g.name: (g.levels, model.group_slices[g.name]) for g in design.groups}
        sparse = design.groups[model.sparse_group].name if model.sparse_group is not None else None
        if variances is None:
            variances = [c.name for c in model.variance_components]
        return cls(fixed=list(design.column_names), groups=groups, n_dense=model.qd,
                   sparse_group=sparse, variances=list(variances),
                   re_columns={g.name: list(g.columns) for g in design.groups},
                   covariances=[g.name for g in design.groups if g.q > 1])

    def columns_of(self, name) -> list:
        """Column names of random-effect term ``name``."""
        return self.re_columns.get(name, ["Intercept"])

    @property
    def p(self) -> int:
        return len(self.fixed)

    @property
    def q(self) -> int:
        return self.n_dense + (len(self.groups[self.sparse_group][1]) if self.sparse_group else 0)

    def to_dict(self):
        return {
            "fixed": list(self.fixed),
            "groups": {k: [[_jsonable(x) for x in lv], [int(i) for i in ix]] for k, (lv, ix) in self.groups.items()},
            "n_dense": int(self.n_dense),
            "sparse_group": self.sparse_group,
            "variances": list(self.variances),
            "re_columns": {k: list(v) for k, v in self.re_columns.items()},
            "covariances": list(self.covariances),
        }

    @classmethod
    def from_dict(cls, d):
        groups = {k: (np.array(lv, dtype=object), np.array(ix, dtype=np.int64)) for k, (lv, ix) in d["groups"].items()}
        return cls(d["fixed"], groups, d["n_dense"], d["sparse_group"], d["variances"],
                   d.get("re_columns", {}), d.get("covariances", []))


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    return x

