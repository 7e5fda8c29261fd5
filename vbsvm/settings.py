"""The settings of a fit: one frozen, typed record per fit, checked once against a table of constraints.

:class:`FitSettings` holds what :func:`vbsvm.svm` was asked to do, with its arguments checked and
its defaults resolved (``fit.settings`` of the linear fits); :class:`GPSettings` the record of a
:func:`vbsvm.gpsvm` run (``fit.settings`` of a :class:`vbsvm.GPFit`). The two differ in almost
every field (priors, imputation and Gibbs run against kernel, inducing points and SVI steps), so
each has its own class and its own table.

Each field's checks are declared once, in :data:`FIT_CONSTRAINTS` and :data:`GP_CONSTRAINTS`
(field -> constraint objects such as ``Integer(minimum=1)``, ``PositiveFloat()``,
``OneOf(...)``, ``Seed()``; the checks between arguments, such as ``max_draws >= draws``, in
:data:`ARGUMENT_RULES`), and run by the one function :func:`validate`, which returns each
value converted to a plain Python type or raises an error that names the argument and what it
must be (:class:`~vbsvm.exceptions.InputTypeError` for a wrong type,
:class:`~vbsvm.exceptions.InputError` for a value out of range). Every new object is checked:
the constructor, :meth:`FitSettings.from_mapping` (a fit file, a dict) and ``dataclasses.replace``
all run the table.

The objects cannot be changed (``FrozenInstanceError`` on an attribute, ``TypeError`` on an
item): a change is a new object, ``dataclasses.replace(settings, draws=500)`` or
:meth:`FitSettings.replace`. They are also read-only mappings (``settings["method"]``,
``settings.get("level", 0.95)``, ``"prior" in settings``, ``dict(settings)``) whose keys are
those of the JSON a fit file stores (:meth:`FitSettings.to_dict`).

Tuning options of single engines that :func:`vbsvm.svm` does not set (``vb_completions`` and
``cut_svm_sweeps`` of the imputation model, the ``ep_*`` options of the calibrated
approximation) are no fields: they are kept in :attr:`FitSettings.options`, read through the
mapping by the engine that owns them (with its default when absent) and checked there, as are
the keys a newer fit file may carry.

This module sits with the foundations (it imports only :mod:`vbsvm.validation` and
:mod:`vbsvm.exceptions`): the fitting layer builds the settings, the results layer rebuilds them
from a file, and every layer in between reads them.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from vbsvm import validation
from vbsvm.exceptions import InputError, InputTypeError

__all__ = ["FitSettings", "GPSettings", "FIT_CONSTRAINTS", "GP_CONSTRAINTS", "ARGUMENT_RULES", "validate",
           "FrozenMapping", "Constraint", "Integer", "PositiveFloat", "Seed", "IntervalLevel", "Penalty", "OneOf",
           "Flag", "Text", "Path", "Matrix", "NumberOrMatrix", "Record", "Records", "Optional", "AtLeast", "freeze",
           "thaw"]


# ============================================================================ frozen containers
class FrozenMapping(Mapping):
    """A read-only, hashable, picklable mapping (the values frozen by :func:`freeze`)."""

    __slots__ = ("_items",)

    def __init__(self, items=()):
        object.__setattr__(self, "_items", {k: freeze(v) for k, v in dict(items).items()})

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)

    def __setattr__(self, name, value):
        raise TypeError(f"{type(self).__name__} cannot be changed")

    def __hash__(self):
        return hash(frozenset(self._items.items()))

    def __repr__(self):
        return f"{type(self).__name__}({self._items!r})"

    def __reduce__(self):
        return type(self), (dict(self._items),)


def freeze(value):
    """``value`` with every dict a :class:`FrozenMapping`, every list, tuple or array a tuple and
    every numpy scalar a Python number (what JSON holds, read-only)."""
    if isinstance(value, FrozenMapping):
        return value
    if isinstance(value, Mapping):
        return FrozenMapping(value)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def thaw(value):
    """The inverse of :func:`freeze`: dicts and lists, for :func:`json.dumps`."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


# ============================================================================ constraints
class Constraint:
    """A check of one value: ``constraint(value, name, checked)`` returns the value converted to a
    plain Python type, or raises an error naming ``name`` and what it must be; ``checked`` holds the
    fields checked before (for a constraint between fields, :class:`AtLeast`)."""

    __slots__ = ()

    def __call__(self, value, name, checked):
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Integer(Constraint):
    """An integer ``>= minimum`` (not a bool) (:func:`vbsvm.validation.integer`)."""

    minimum: int = 1

    def __call__(self, value, name, checked):
        return validation.integer(value, name, minimum=self.minimum)


@dataclass(frozen=True, slots=True)
class PositiveFloat(Constraint):
    """A finite number ``> 0`` (:func:`vbsvm.validation.positive_float`)."""

    def __call__(self, value, name, checked):
        return validation.positive_float(value, name)


@dataclass(frozen=True, slots=True)
class Seed(Constraint):
    """``None`` or a non-negative integer (the seed of :func:`numpy.random.default_rng`)."""

    def __call__(self, value, name, checked):
        if value is None or (isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0):
            return None if value is None else int(value)
        raise InputTypeError(f"{name} must be a non-negative integer or None, got {value!r}.")


@dataclass(frozen=True, slots=True)
class IntervalLevel(Constraint):
    """An interval level in (0, 1), e.g. 0.95."""

    def __call__(self, value, name, checked):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
            raise InputError(f"{name} must be in (0, 1), e.g. 0.95; got {value!r}.")
        return float(value)


@dataclass(frozen=True, slots=True)
class Penalty(Constraint):
    """``"auto"`` (inferred), ``None`` (none) or a positive number alpha
    (:func:`vbsvm.validation.penalty`)."""

    def __call__(self, value, name, checked):
        return validation.penalty(value)


@dataclass(frozen=True, slots=True)
class OneOf(Constraint):
    """One of ``options`` (compared by type and value). ``message`` (optional) is the error's
    text, formatted with ``name``, ``options`` and ``value``."""

    options: tuple
    message: str | None = None

    def __call__(self, value, name, checked):
        if any(value is o or (type(value) is type(o) and value == o) for o in self.options):
            return value
        text = self.message or "{name} must be one of {options}; got {value!r}."
        raise InputError(text.format(name=name, options=self.options, value=value))


@dataclass(frozen=True, slots=True)
class Flag(Constraint):
    """True or False (a numpy bool too)."""

    def __call__(self, value, name, checked):
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise InputTypeError(f"{name} must be True or False, got {value!r}.")


@dataclass(frozen=True, slots=True)
class Text(Constraint):
    """A string. ``message`` (optional) is the error's text, formatted with ``name`` and
    ``kind`` (the type's name)."""

    message: str | None = None

    def __call__(self, value, name, checked):
        if isinstance(value, str):
            return value
        text = self.message or "{name} must be a string, got {kind}."
        raise InputTypeError(text.format(name=name, kind=type(value).__name__))


@dataclass(frozen=True, slots=True)
class Path(Constraint):
    """A file path (``str`` or :class:`os.PathLike`), kept as a string."""

    def __call__(self, value, name, checked):
        if isinstance(value, (str, os.PathLike)):
            path = os.fspath(value)
            if isinstance(path, str):
                return path
        raise InputTypeError(f"{name} must be a path (a str or pathlib.Path), got {value!r}.")


def _matrix(value, name):
    try:
        return freeze(np.asarray(value, dtype=float).tolist())
    except (TypeError, ValueError):
        raise InputTypeError(f"{name} must be a matrix of numbers (a nested list or array), got {value!r}.") from None


@dataclass(frozen=True, slots=True)
class Matrix(Constraint):
    """An array of numbers, kept as nested tuples of floats (its shape is checked against the
    model it enters)."""

    def __call__(self, value, name, checked):
        return _matrix(value, name)


@dataclass(frozen=True, slots=True)
class NumberOrMatrix(Constraint):
    """A number (times the identity) or a matrix (:class:`Matrix`)."""

    def __call__(self, value, name, checked):
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, (bool, str)) or np.ndim(value) == 0:
            raise InputTypeError(f"{name} must be a number or a matrix of numbers, got {value!r}.")
        return _matrix(value, name)


@dataclass(frozen=True, slots=True)
class Record(Constraint):
    """A JSON object (a mapping with string keys), kept frozen."""

    def __call__(self, value, name, checked):
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return freeze(value)
        raise InputTypeError(f"{name} must be a dict with string keys, got {value!r}.")


@dataclass(frozen=True, slots=True)
class Records(Constraint):
    """A list of JSON objects (:class:`Record`), kept as a tuple."""

    def __call__(self, value, name, checked):
        if isinstance(value, (list, tuple)):
            return tuple(Record()(v, name, checked) for v in value)
        raise InputTypeError(f"{name} must be a list of dicts, got {value!r}.")


@dataclass(frozen=True, slots=True)
class Optional(Constraint):
    """``None``, or a value that meets ``inner``."""

    inner: Constraint

    def __call__(self, value, name, checked):
        return None if value is None else self.inner(value, name, checked)


@dataclass(frozen=True, slots=True)
class AtLeast(Constraint):
    """``None`` or at least the (checked) field ``other``; ``message`` is formatted with ``name``,
    ``other``, ``bound`` (that field's value) and ``value``."""

    other: str
    message: str = "{name} must be at least {other} = {bound}; got {value}."

    def __call__(self, value, name, checked):
        bound = checked.get(self.other)
        if value is not None and bound is not None and value < bound:
            raise InputError(self.message.format(name=name, other=self.other, bound=bound, value=value))
        return value


def validate(values, constraints):
    """Check ``values`` (name -> value) against the table ``constraints`` (name -> constraints),
    in the table's order.

    Returns
    -------
    dict
        ``values`` with every value the table names converted by its constraints (plain Python
        types, frozen containers); the others as given.

    Raises
    ------
    vbsvm.exceptions.InputTypeError, vbsvm.exceptions.InputError
        The first value that fails, naming it and what it must be.
    """
    checked = dict(values)
    for name, rules in constraints.items():
        if name in checked:
            value = checked[name]
            for rule in rules:
                value = rule(value, name, checked)
            checked[name] = value
    return checked


# ============================================================================ the linear fits
#: methods of :func:`vbsvm.svm` (``"meanfield"`` is stored as ``method="vb"``,
#: ``approximation="meanfield"``)
METHODS = ("vb", "meanfield", "gibbs", "map")
MISSING = ("drop", "raise", "impute")
IMPUTATIONS = ("conditional", "joint")

_MAX_DRAWS = ("{name} must be at least draws = {bound} (max_draws=draws switches the extension of Gibbs runs "
              "off); got {value}.")

#: Checks between the arguments of :func:`vbsvm.svm` and :func:`vbsvm.gpsvm`, run on the checked
#: values before a fit (not on a fit's record, whose ``draws`` are the draws kept, or the shape of
#: the VB draws: a record may be redrawn in another shape).
ARGUMENT_RULES = {
    "max_draws": (AtLeast("draws", _MAX_DRAWS),),
}

#: The checks of every field of :class:`FitSettings`, in the order they run. The shapes of
#: ``Psi`` and ``re_scale``, and ``re_df`` against the dimension of a random-effect term, are
#: checked by the model they enter (they depend on the design).
FIT_CONSTRAINTS = {
    "formula": (Text("{name} must be a string such as 'y ~ x1 + x2', got {kind}."),),
    "method": (OneOf(METHODS),),
    "approximation": (OneOf(("calibrated", "meanfield", None)),),
    "level": (IntervalLevel(),),
    "draws": (Integer(minimum=1),),
    "max_draws": (Optional(Integer(minimum=1)),),
    "penalty": (Penalty(),),
    "missing": (OneOf(MISSING, "{name} must be one of {options}, got {value!r}."),),
    "standardize": (Flag(),),
    "tune": (Integer(minimum=0),),
    "chains": (Integer(minimum=1),),
    "thin": (Integer(minimum=1),),
    "seed": (Seed(),),
    "draw_seed": (Seed(),),
    "tol": (PositiveFloat(),),
    "max_iter": (Integer(minimum=1),),
    "sigma2_beta": (PositiveFloat(),),
    "A_u": (PositiveFloat(),),
    "B_u": (PositiveFloat(),),
    "accelerate": (Flag(),),
    "progress": (Flag(),),
    "n_jobs": (Integer(minimum=1),),
    "imputation": (OneOf(IMPUTATIONS, "{name} must be 'conditional' (default: predictors given the observed "
                                      "ones and the label, cut from the SVM) or 'joint' (the paper's model); "
                                      "got {value!r}."),),
    "sigma2_mu": (PositiveFloat(),),
    "nu": (PositiveFloat(),),
    "Psi": (NumberOrMatrix(),),
    "re_df": (Optional(PositiveFloat()),),
    "checkpoint": (Optional(Path()),),
    "re_scale": (Optional(Matrix()),),
    "prior": (Optional(Record()),),
}


class _Record(Mapping):
    """The read-only mapping view of a settings dataclass: its fields (less those
    :meth:`_omitted`) and its ``options``, in the order of :meth:`to_dict`."""

    __slots__ = ()

    def _omitted(self, name) -> bool:
        return False

    def _names(self):
        return [f.name for f in dataclasses.fields(self) if f.name != "options" and not self._omitted(f.name)]

    def __getitem__(self, key):
        if isinstance(key, str) and key in _field_names(type(self)) and key != "options":
            if not self._omitted(key):
                return getattr(self, key)
            raise KeyError(key)
        return self.options[key]

    def __iter__(self):
        yield from self._names()
        yield from self.options

    def __len__(self):
        return len(self._names()) + len(self.options)

    def to_dict(self) -> dict:
        """The settings as plain JSON types (dicts, lists), in the order a fit file stores them."""
        return {key: thaw(value) for key, value in self.items()}

    def _check(self, constraints):
        for name, value in validate({f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                                     if f.name in constraints}, constraints).items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "options", _check_options(self.options, _field_names(type(self))))

    @classmethod
    def from_mapping(cls, values):
        """The settings from a mapping (a fit file's JSON, a dict of settings), checked: keys this
        class has no field for go to ``options`` (a newer file's, an engine's tuning options)."""
        if isinstance(values, cls):
            return values
        if not isinstance(values, Mapping):
            raise InputTypeError(f"settings must be a dict or {cls.__name__}, got {type(values).__name__}.")
        names = _field_names(cls)
        known = {k: v for k, v in values.items() if k in names and k != "options"}
        extra = {k: v for k, v in values.items() if k not in known}
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in known
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise InputError(f"the settings lack {missing[0]!r}.")
        return cls(**known, options=extra)

    def replace(self, **changes):
        """A new object with ``changes`` (checked); keys that are no field go to ``options``."""
        names = _field_names(type(self))
        fields = {k: v for k, v in changes.items() if k in names and k != "options"}
        extra = {k: v for k, v in changes.items() if k not in fields}
        if extra:
            fields["options"] = {**self.options, **extra}
        return dataclasses.replace(self, **fields)


@functools.cache
def _field_names(cls) -> frozenset:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _check_options(options, names):
    """``options`` as a :class:`FrozenMapping`: string keys, none of them a field."""
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise InputTypeError(f"options must be a dict with string keys, got {options!r}.")
    fields = [k for k in options if k in names and k != "options"]
    if fields:
        raise InputError(f"options may not set the field {fields[0]!r}; pass it as {fields[0]}=...")
    return FrozenMapping(options)


@dataclass(frozen=True, slots=True, kw_only=True)
class FitSettings(_Record):
    """The checked settings of a linear fit (:func:`vbsvm.svm`): frozen, typed, read-only mapping.

    Built by :func:`vbsvm.fitting.svm.fit_settings` from the arguments of :func:`vbsvm.svm`, or
    by :meth:`from_mapping` from a fit file; each field is checked by :data:`FIT_CONSTRAINTS`.
    The fields are the arguments of :func:`vbsvm.svm` (see there), with ``method`` ``"vb"``,
    ``"gibbs"`` or ``"map"`` and ``approximation`` ``"calibrated"`` (``method="vb"``),
    ``"meanfield"`` (``method="meanfield"``) or None, ``tune`` resolved, and:

    Attributes
    ----------
    draw_seed : int or None
        Seed of the iid draws from q a VB fit gives (fixed at fit time, also with ``seed=None``).
    prior : FrozenMapping or None
        The Laplace-zero prior's description (``LaplaceZero.to_dict()``); not a key of the
        mapping when None.
    options : FrozenMapping
        Engine tuning options :func:`vbsvm.svm` does not set, and keys of newer fit files; keys
        of the mapping, checked by the engine that reads them.
    """

    formula: str
    method: str
    approximation: str | None = None
    penalty: str | float | None = "auto"
    missing: str = "drop"
    standardize: bool = True
    draws: int = 1000
    max_draws: int | None = None
    tune: int = 1000
    chains: int = 4
    thin: int = 1
    seed: int | None = None
    draw_seed: int | None = None
    tol: float = 1e-8
    max_iter: int = 1000
    sigma2_beta: float = 1e8
    A_u: float = 0.01
    B_u: float = 0.01
    level: float = 0.95
    accelerate: bool = True
    progress: bool = True
    n_jobs: int = 1
    sigma2_mu: float = 1e8
    nu: float = 3.0
    imputation: str = "conditional"
    Psi: float | tuple = 0.01
    re_df: float | None = None
    checkpoint: str | None = None
    re_scale: tuple | None = None
    prior: FrozenMapping | None = None
    options: FrozenMapping = field(default_factory=FrozenMapping)

    def __post_init__(self):
        self._check(FIT_CONSTRAINTS)

    def _omitted(self, name) -> bool:
        return name == "prior" and self.prior is None


# ============================================================================ the GP fits
_GP_RUN = ("draws_requested", "max_draws", "draws_extended", "extension_rounds")

#: The checks of every field of :class:`GPSettings`, in the order they run (the arguments of
#: :func:`vbsvm.gpsvm` are checked with it before the fit).
GP_CONSTRAINTS = {
    "kernel": (Text(),),
    "n_inducing": (Integer(minimum=1),),
    "inducing": (Text(),),
    "batch_size": (Optional(Integer(minimum=1)),),
    "optimize": (Flag(),),
    "step": (Text(),),
    "seed": (Seed(),),
    "tune": (Integer(minimum=0),),
    "chains": (Integer(minimum=1),),
    "thin": (Integer(minimum=1),),
    "n_jobs": (Integer(minimum=1),),
    "streaming": (Flag(),),
    "draws_requested": (Optional(Integer(minimum=1)),),
    "draws": (Integer(minimum=1),),
    "max_draws": (Optional(Integer(minimum=1)),),
    "draws_extended": (Optional(Flag()),),
    "extension_rounds": (Optional(Records()),),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class GPSettings(_Record):
    """The record of a :func:`vbsvm.gpsvm` run (``GPFit.settings``): frozen, typed, read-only
    mapping, each field checked by :data:`GP_CONSTRAINTS`.

    ``kernel`` is the kernel's text, ``n_inducing`` the number of inducing points used,
    ``inducing`` how they were chosen (``"array"``: given), ``step`` the SVI step rule,
    ``streaming`` whether the rows were streamed; the other fields are the arguments of
    :func:`vbsvm.gpsvm`. A Gibbs run also records its length (:func:`vbsvm.inference.dispatch.record_run_length`):
    ``draws_requested``, ``draws`` (kept per chain), ``max_draws``, ``draws_extended`` and
    ``extension_rounds``; they are no keys of the mapping for the other methods.
    """

    kernel: str = "rbf"
    n_inducing: int = 64
    inducing: str = "kmeans"
    batch_size: int | None = 100
    optimize: bool = True
    step: str = "adaptive"
    seed: int | None = None
    tune: int = 500
    chains: int = 4
    thin: int = 1
    n_jobs: int = 1
    streaming: bool = False
    draws_requested: int | None = None
    draws: int = 1000
    max_draws: int | None = None
    draws_extended: bool | None = None
    extension_rounds: tuple | None = None
    options: FrozenMapping = field(default_factory=FrozenMapping)

    def __post_init__(self):
        self._check(GP_CONSTRAINTS)

    def _omitted(self, name) -> bool:
        return name in _GP_RUN and self.draws_requested is None
