"""Loaders for the real benchmark data sets used with :mod:`vbsvm`.

What ships
----------
``toenail``, ``spam`` (with ESL's train/test indicator), ``acath`` and the
Rätsch benchmarks (``raetsch/<name>``, including the raw DELVE files of
ringnorm and twonorm) ship with the package as gzip-compressed CSV files.
They live once, in the repository's top-level ``data/`` directory, one
folder per set; ``pyproject.toml`` maps that directory onto the package
``vbsvm.datasets.data``, so an installed wheel holds them in
``vbsvm/datasets/data/``. Each folder has a ``PROVENANCE.md``: the source
(registry package or public repository, with checksums), the license, the
sha256 of the uncompressed CSV and how it was converted.

``usps`` (11 MB as CSV) is not shipped; ``data/usps/PROVENANCE.md`` says
where its two files come from. It is read from a data directory only.

Where a file is looked for
--------------------------
A data directory has the layout of ``data/``: ``<dir>/toenail/toenail.csv``,
``<dir>/spam/spam.csv`` and ``spam_esl_traintest.csv``, ``<dir>/acath/acath.csv``,
``<dir>/raetsch/<name>.csv``, ``<dir>/usps/usps_3vs5_resampled.csv`` and
``usps_3vs5_original_split.csv``; each file may also be gzip-compressed
(``.csv.gz``). The directories searched:

1. ``data_home``, if given, and then only there (an explicit argument is
   never silently replaced by another directory);
2. otherwise the directory in the environment variable ``VBSVM_DATA``, if set;
3. then the bundled data: ``vbsvm/datasets/data`` in an installed package,
   or ``data/`` in a source checkout (the directory that holds ``pyproject.toml``
   and the ``vbsvm`` package), where the mapped package does not exist.

In cases 2-3 the first directory that holds the file is used. If none does,
:class:`DataNotFoundError` (a :class:`FileNotFoundError`) names the
directories tried and says how to set ``VBSVM_DATA``.

The bundled data ship with the code (not in a folder beside a source
checkout), so a clone and a wheel need nothing outside themselves.

Column names
------------
Columns are renamed to lower snake_case by one rule (see :func:`snake_case`):
dots and other non-alphanumeric characters become ``_`` and camelCase is
split before each capital that follows a lower-case letter or digit
(``patientID`` -> ``patient_id``, ``cad.dur`` -> ``cad_dur``,
``charExclamation`` -> ``char_exclamation``). Values are returned as in the
source: responses keep their coding and missing values stay ``NaN``.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import numpy as np
import pandas as pd

from vbsvm.datasets._errors import DataFormatError, DataNotFoundError, UnknownDatasetError

__all__ = ["load", "available", "snake_case", "ENV_VAR"]

#: Name of the environment variable that points at the data directory.
ENV_VAR = "VBSVM_DATA"

# A file "<folder>/<stem>" is read as <stem>.csv or, failing that, <stem>.csv.gz.
_SUFFIXES = (".csv", ".csv.gz")

_RAETSCH = (
    "banana",
    "breast_cancer",
    "diabetis",
    "flare_solar",
    "german",
    "heart",
    "image",
    "splice",
    "thyroid",
    "titanic",
    "waveform",
)
# name -> (rows, columns) of the CSV file as stored (before any conversion).
_RAETSCH_SHAPES = {
    "banana": (5300, 3),
    "breast_cancer": (263, 10),
    "diabetis": (768, 9),
    "flare_solar": (144, 10),
    "german": (1000, 21),
    "heart": (270, 14),
    "image": (2086, 19),
    "splice": (2991, 61),
    "thyroid": (215, 6),
    "titanic": (24, 4),
    "waveform": (5000, 22),
    "ringnorm_delve_raw": (7400, 21),
    "twonorm_delve_raw": (7400, 21),
}

_USPS_FILES = {
    "resampled": "usps/usps_3vs5_resampled",
    "original": "usps/usps_3vs5_original_split",
}

# --------------------------------------------------------------------------- names

_NON_ALNUM = re.compile(r"[^0-9A-Za-z]+")
_ACRONYM_END = re.compile(r"([A-Z]+)([A-Z][a-z])")  # "HTMLFile" -> "HTML_File"
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")  # "patientID" -> "patient_ID"


def snake_case(name: str) -> str:
    """Convert a column name to lower snake_case.

    The rule: every run of characters other than ASCII letters and digits
    (dots, spaces, dashes, ...) becomes one ``_``; an ``_`` is inserted
    before a capital letter that follows a lower-case letter or a digit, and
    between an acronym and a following capitalised word; the result is
    lower-cased and stripped of leading and trailing ``_``. Digits are never
    split off (``num3d`` stays ``num3d``).

    Parameters
    ----------
    name : str
        Column name as in the source file.

    Returns
    -------
    str
        The snake_case name.

    Examples
    --------
    >>> snake_case("patientID"), snake_case("cad.dur"), snake_case("charExclamation")
    ('patient_id', 'cad_dur', 'char_exclamation')
    """
    s = _NON_ALNUM.sub("_", str(name))
    s = _ACRONYM_END.sub(r"\1_\2", s)
    s = _CAMEL.sub(r"\1_\2", s)
    return s.lower().strip("_")


def _snake_columns(df: pd.DataFrame) -> pd.DataFrame:
    new = [snake_case(c) for c in df.columns]
    if len(set(new)) != len(new):  # pragma: no cover - guards against a changed source file
        raise DataFormatError(f"snake_case renaming made duplicate column names: {new}")
    return df.set_axis(new, axis=1)


# ------------------------------------------------------------------ directories


def _bundled_dir(package: Traversable | None = None, checkout: Path | None = None) -> Traversable:
    """Root of the data tree that ships with :mod:`vbsvm`.

    Parameters
    ----------
    package : Traversable, optional
        Where an installed wheel holds the data (default: ``vbsvm/datasets/data``,
        the package that ``pyproject.toml`` maps onto the top-level ``data/``).
    checkout : pathlib.Path, optional
        The source checkout this module would belong to (default: the
        directory two levels above ``vbsvm/datasets``).

    Returns
    -------
    Traversable
        `package` if it exists; else ``checkout / "data"`` if `checkout` is a
        source checkout (it holds ``pyproject.toml`` and ``data/``); else `package`,
        so that an error message names where an installation should have the files.
    """
    if package is None:
        package = resources.files(__package__).joinpath("data")
    if checkout is None:
        checkout = Path(__file__).resolve().parents[2]
    if package.is_dir():
        return package
    if (checkout / "pyproject.toml").is_file() and (checkout / "data").is_dir():
        return checkout / "data"
    return package


def _candidate_dirs(data_home: str | os.PathLike | None) -> list[tuple[Traversable, str]]:
    """Directories to search, with a note on where each came from."""
    if data_home is not None:
        return [(Path(data_home).expanduser(), "data_home argument")]
    dirs: list[tuple[Traversable, str]] = []
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        dirs.append((Path(env).expanduser(), f"environment variable {ENV_VAR}"))
    dirs.append((_bundled_dir(), "shipped with vbsvm"))
    return dirs


def _file_in(directory: Traversable, stem: str) -> Traversable | None:
    """``directory/<stem>.csv`` or ``directory/<stem>.csv.gz``, whichever exists first; else None."""
    for suffix in _SUFFIXES:
        candidate = directory.joinpath(*f"{stem}{suffix}".split("/"))
        if candidate.is_file():
            return candidate
    return None


def _locate(name: str, stem: str, data_home) -> tuple[Traversable, Traversable]:
    """The first data directory that holds `stem` (``"<folder>/<file stem>"``), and that file."""
    tried = []
    for directory, origin in _candidate_dirs(data_home):
        found = _file_in(directory, stem)
        if found is not None:
            return directory, found
        state = "no such file" if directory.is_dir() else "directory does not exist"
        tried.append(f"  {directory}  ({origin}; {state}: {stem}.csv or {stem}.csv.gz)")
    bundled = _bundled_dir()
    if _file_in(bundled, stem) is not None:  # only an explicit data_home can miss a shipped file
        hint = f"vbsvm ships {name!r} in {bundled}: call load({name!r}) without data_home to read it."
    else:
        folder = stem.split("/")[0]
        hint = (
            f"Pass data_home='/path/to/data' or set the environment variable {ENV_VAR} to a "
            f"directory that holds {stem}.csv ({folder}/PROVENANCE.md in {bundled} says where "
            f"{folder!r} comes from)."
        )
    raise DataNotFoundError(
        f"data set {name!r} needs the file {stem}.csv (or .csv.gz), which was not found. "
        "Directories tried:\n" + "\n".join(tried) + "\n" + hint
    )


def _read_csv(source: Traversable, name: str, shape: tuple[int, int]) -> pd.DataFrame:
    compression = "gzip" if source.name.endswith(".gz") else None
    with source.open("rb") as fh:
        # Only the literal token "NA" means missing (the convention of the data files).
        df = pd.read_csv(fh, compression=compression, keep_default_na=False, na_values=["NA"])
    if df.shape != shape:
        raise DataFormatError(
            f"data set {name!r}: file {source} has {df.shape[0]} rows x {df.shape[1]} columns, "
            f"expected {shape[0]} x {shape[1]}; is it the right file?"
        )
    return df


def _finish(df: pd.DataFrame, name: str, path) -> pd.DataFrame:
    df.attrs["dataset"] = name
    df.attrs["source"] = str(path)
    return df


# --------------------------------------------------------------------- loaders


def _load_toenail(name, data_home, split):
    _, path = _locate(name, "toenail/toenail", data_home)
    return _finish(_snake_columns(_read_csv(path, name, (1908, 7))), name, path)


def _load_spam(name, data_home, split):
    directory, path = _locate(name, "spam/spam", data_home)
    df = _snake_columns(_read_csv(path, name, (4601, 58)))
    if split is None:
        return _finish(df, name, path)
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r} is not valid for 'spam'; use 'train' or 'test' (ESL's split)")
    flag_path = _file_in(directory, "spam/spam_esl_traintest")
    if flag_path is None:
        raise DataNotFoundError(
            f"data set 'spam': found {path} but not spam_esl_traintest.csv (or .csv.gz) next to it "
            "(ESL's train/test indicator, needed for split='train'/'test')."
        )
    flag = _read_csv(flag_path, name, (4601, 1))["test"]
    if not flag.isin([0, 1]).all():
        raise DataFormatError(f"{flag_path}: column 'test' must hold only 0 and 1")
    keep = flag.to_numpy(dtype=bool) == (split == "test")
    df = df.loc[keep]
    df.attrs["split"] = split
    return _finish(df, name, path)


def _load_acath(name, data_home, split):
    _, path = _locate(name, "acath/acath", data_home)
    return _finish(_snake_columns(_read_csv(path, name, (3504, 6))), name, path)


def _load_usps(name, data_home, split):
    split = "resampled" if split is None else split
    if split not in _USPS_FILES:
        raise ValueError(
            f"split={split!r} is not valid for 'usps'; use 'resampled' (Rasmussen & Williams, "
            "the default) or 'original' (USPS/ESL train-test split)"
        )
    _, path = _locate(name, _USPS_FILES[split], data_home)
    df = _snake_columns(_read_csv(path, name, (1540, 260)))
    df.attrs["split"] = split
    return _finish(df, name, path)


def _raetsch_loader(short: str) -> Callable:
    def loader(name, data_home, split):
        _, path = _locate(name, f"raetsch/{short}", data_home)
        return _finish(_read_csv(path, name, _RAETSCH_SHAPES[short]), name, path)

    return loader


def _delve_to_raetsch(raw: pd.DataFrame) -> pd.DataFrame:
    """Rätsch's ringnorm/twonorm from the raw DELVE frame (``x1..x20``, ``y01``).

    Each feature column is standardized over all rows, ``(x - mean) / std``
    with ``ddof=1``; the label is mapped DELVE 0 -> +1 and DELVE 1 -> -1.
    """
    xcols = [c for c in raw.columns if c != "y01"]
    x = raw[xcols].to_numpy(dtype=np.float64)
    z = (x - x.mean(axis=0)) / x.std(axis=0, ddof=1)
    out = pd.DataFrame(z, columns=xcols, index=raw.index)
    y01 = raw["y01"].to_numpy()
    if not np.isin(y01, (0, 1)).all():
        raise DataFormatError("column 'y01' of the DELVE file must hold only 0 and 1")
    out["y"] = np.where(y01 == 0, 1, -1).astype(np.int64)
    return out


def _delve_loader(short: str) -> Callable:
    def loader(name, data_home, split):
        raw_name = f"{short}_delve_raw"
        _, path = _locate(name, f"raetsch/{raw_name}", data_home)
        raw = _read_csv(path, name, _RAETSCH_SHAPES[raw_name])
        return _finish(_delve_to_raetsch(raw), name, path)

    return loader


# name -> loader(name, data_home, split) -> DataFrame
_REGISTRY: dict[str, Callable] = {
    "toenail": _load_toenail,
    "spam": _load_spam,
    "acath": _load_acath,
    "usps": _load_usps,
}
for _short in _RAETSCH:
    _REGISTRY[f"raetsch/{_short}"] = _raetsch_loader(_short)
for _short in ("ringnorm", "twonorm"):
    _REGISTRY[f"raetsch/{_short}"] = _delve_loader(_short)
    _REGISTRY[f"raetsch/{_short}_delve_raw"] = _raetsch_loader(f"{_short}_delve_raw")
del _short


def available() -> list[str]:
    """Names of the data sets that :func:`load` knows.

    Returns
    -------
    list of str
        Sorted names: ``"acath"``, ``"raetsch/<name>"`` (including
        ``"raetsch/ringnorm_delve_raw"`` and ``"raetsch/twonorm_delve_raw"``),
        ``"spam"``, ``"toenail"``, ``"usps"``. All but ``"usps"`` ship with
        the package; ``"usps"`` needs a data directory (see :func:`load`).
    """
    return sorted(_REGISTRY)


def load(
    name: str,
    data_home: str | os.PathLike | None = None,
    *,
    split: str | None = None,
) -> pd.DataFrame:
    """Load a benchmark data set as a :class:`pandas.DataFrame`.

    Parameters
    ----------
    name : str
        One of :func:`available` (case-insensitive).
    data_home : str or path-like, optional
        Directory that holds the data folders (``toenail/``, ``spam/``,
        ``acath/``, ``raetsch/``, ``usps/``) with ``.csv`` or ``.csv.gz``
        files. If given, only this directory is used. If omitted, the
        directory in the environment variable ``VBSVM_DATA`` (if set) and then
        the data shipped with the package are searched; every data set but
        ``"usps"`` ships (see :mod:`vbsvm.datasets.loaders`).
    split : str, optional
        For ``"usps"``: ``"resampled"`` (default) is the Rasmussen &
        Williams (2006) 3-vs-5 split (767 train, 773 test);
        ``"original"`` is the original USPS/ESL train/test split
        (1214 train, 326 test). Both hold the same kind of columns.
        For ``"spam"``: ``"train"`` (3065 rows) or ``"test"`` (1536 rows) of
        ESL's split (``spam_esl_traintest.csv``); the row index keeps the
        position in the full data set. Default: all 4601 rows.

    Returns
    -------
    pandas.DataFrame
        Rows in source order. ``df.attrs`` holds ``"dataset"`` (the name) and
        ``"source"`` (the file read, e.g. ``.../vbsvm/datasets/data/raetsch/heart.csv.gz``).

    Raises
    ------
    UnknownDatasetError
        If `name` is not known (a :class:`ValueError`; the message lists the names).
    DataNotFoundError
        If the file is not found (a :class:`FileNotFoundError`; the message
        names the directories tried and how to set ``VBSVM_DATA``); for a
        shipped data set only if ``data_home`` points elsewhere.
    DataFormatError
        If a file does not have the expected number of rows and columns.
    ValueError
        If `split` is given for a data set other than ``"usps"`` and ``"spam"``
        or is not valid.

    Notes
    -----
    Column names are converted with :func:`snake_case`. The data sets:

    ``"toenail"`` (1908 x 7; De Backer et al. 1998, via HSAUR3). Columns
        ``patient_id`` (renamed from ``patientID``; 294 patients), ``outcome``
        (``"none or mild"`` / ``"moderate or severe"``), ``treatment``
        (``"itraconazole"`` / ``"terbinafine"``), ``time`` (months),
        ``visit`` (1-7), ``y`` (1 if outcome is moderate or severe, else 0;
        408 ones) and ``terbinafine`` (0/1). Example model:
        ``"y ~ time * terbinafine + (1 | patient_id)"``.
    ``"spam"`` (4601 x 58; HP spambase as in R's kernlab). 57 numeric
        predictors and ``type`` (``"spam"`` / ``"nonspam"``), so that
        ``"type ~ ."`` uses every predictor; ESL's train/test split via ``split``.
        Renamed: ``charSemicolon`` -> ``char_semicolon``, ``charRoundbracket``
        -> ``char_roundbracket``, ``charSquarebracket`` -> ``char_squarebracket``,
        ``charExclamation`` -> ``char_exclamation``, ``charDollar`` ->
        ``char_dollar``, ``charHash`` -> ``char_hash``, ``capitalAve`` ->
        ``capital_ave``, ``capitalLong`` -> ``capital_long``, ``capitalTotal``
        -> ``capital_total``; the 48 word-frequency names are unchanged.
    ``"acath"`` (3504 x 6; Harrell's Duke catheterization data). ``sex``,
        ``age``, ``cad_dur`` (renamed from ``cad.dur``), ``choleste`` (1246
        NaN), ``sigdz`` (0/1 response), ``tvdlm`` (3 NaN).
    ``"raetsch/<name>"`` for banana, breast_cancer, diabetis, flare_solar,
        german, heart, image, splice, thyroid, titanic, waveform, ringnorm and
        twonorm: features ``x1..xd`` and ``y`` in {-1, +1}, the unique
        patterns of Rätsch's benchmarks (no train/test splits).
        ``"raetsch/ringnorm"`` and ``"raetsch/twonorm"`` are computed from the
        raw DELVE files exactly as Rätsch did: each column standardized over
        all 7400 rows with ``ddof=1``, DELVE label 0 -> +1 and 1 -> -1.
        ``"raetsch/ringnorm_delve_raw"`` and ``"raetsch/twonorm_delve_raw"``
        return the raw values with the DELVE label ``y01`` in {0, 1}.
    ``"usps"`` (1540 x 260; digits 3 and 5; not shipped, read from
        ``data_home`` or ``VBSVM_DATA``). ``split`` (``"train"`` /
        ``"test"``), ``orig_index``, ``digit`` (3 or 5), ``y`` (+1 for 3,
        -1 for 5) and pixels ``p1..p256`` in [-1, 1]. Drop ``split``,
        ``orig_index`` and ``digit`` before fitting ``y ~ .``.

    Examples
    --------
    >>> from vbsvm import datasets
    >>> toenail = datasets.load("toenail")
    >>> toenail.shape
    (1908, 7)
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    key = name.strip().lower()
    loader = _REGISTRY.get(key)
    if loader is None:
        names = available()
        close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
        close += [n for n in names if n.endswith("/" + key) and n not in close]
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownDatasetError(
            f"unknown data set {name!r}.{hint} Available: {', '.join(names)}."
        )
    if split is not None and key not in ("usps", "spam"):
        raise ValueError(f"split= applies only to 'usps' and 'spam', not to {key!r}")
    return loader(key, data_home, split)
