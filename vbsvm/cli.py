"""The ``vbsvm`` command: fit a Bayesian SVM to a CSV file, compare saved fits, run the demo.

::

    vbsvm demo
    vbsvm fit "y ~ x1 + x2 + (1 | group)" data.csv --method gibbs --out fit.nc
    vbsvm compare vb.nc gibbs.nc

Every error is reported as one line on stderr (``vbsvm: error: ...``) with exit status 2;
``--traceback`` shows the Python traceback instead (for bug reports).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import warnings

__all__ = ["main", "build_parser"]

EXIT_ERROR = 2

DEMO_FORMULA = "y ~ time * terbinafine + (1 | patient_id)"
DEMO_CHAINS, DEMO_DRAWS, DEMO_TUNE = 4, 5000, 1000

MAIN_DESCRIPTION = """\
Bayesian support vector machines for statisticians: a formula in, a fitted model out.

The SVM hinge loss is written as a pseudo-likelihood with the Polson & Scott (2011) data
augmentation (Luts & Ormerod 2014) and fitted by a calibrated fast approximation (the default:
expectation propagation integrated over the variance parameters), the paper's mean-field
variational Bayes (--method meanfield), Gibbs sampling (exact up to Monte Carlo error) or the
posterior mode. Start with "vbsvm demo"."""

MAIN_EPILOG = """\
Run "vbsvm COMMAND --help" for the options and examples of a command, e.g. "vbsvm fit --help"."""

FIT_EPILOG = """\
formula syntax (R / patsy style):
  y ~ x1 + x2              two predictors (an intercept is added)
  y ~ .                    every column except the response (and grouping columns)
  y ~ x1 * C(sex)          main effects and interaction; C() marks a categorical column
  y ~ np.log(x1) + I(x2**2)   transformations
  y ~ x1 + (1 | patient)   random intercept per patient (several (1|g) terms allowed)
  y ~ x1 - 1               no intercept
Only column names, numbers, formula operators and the functions C(), I(), Q(), center(),
scale(), poly(), bs(), ... and elementwise np.* functions (np.log, np.exp, np.sqrt, ...) are
accepted: a formula is evaluated as Python, so one from a file or a script is checked first.
The response must have two values: 0/1, -1/+1, False/True or two labels (the second,
in sorted order, is coded +1; the summary says which).

examples:
  vbsvm fit "y ~ ." heart.csv
  vbsvm fit "y ~ time * terbinafine + (1 | patientID)" toenail.csv --penalty none \\
        --method gibbs --draws 5000 --out toenail_gibbs.nc
  vbsvm fit "type ~ ." spam.csv --prior laplace-zero --rho 0.01
  vbsvm fit "sigdz ~ age + sex + np.log(choleste)" acath.csv --missing impute"""

COMPARE_EPILOG = """\
The reference (the fit the others are measured against) is the first Gibbs fit, else the
first file. Columns: mean and sd under each fit; diff_sd = (mean - reference mean) /
reference sd; sd_ratio = sd / reference sd; sd_lr = linear-response corrected VB sd
(experimental); accuracy = 100 (1 - 0.5 * integral |q - p_ref|) %, the overlap of the two
marginal densities (100% = identical).

example:
  vbsvm fit "y ~ ." heart.csv --out vb.nc
  vbsvm fit "y ~ ." heart.csv --method gibbs --out gibbs.nc
  vbsvm compare vb.nc gibbs.nc --forest forest.png"""


class CLIError(Exception):
    """A usage error detected by the command line itself."""


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line: ``vbsvm fit: error: ... (see --help)``."""

    def error(self, message):
        raise CLIError(f"{message} (see '{self.prog} --help')")


def _int_at_least(minimum):
    """argparse type: a whole number >= ``minimum``."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1)
_nonnegative_int = _int_at_least(0)


def _penalty(text):
    low = text.strip().lower()
    if low == "auto":
        return "auto"
    if low in ("none", "null", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'auto', 'none' or a positive number alpha, got {text!r}") from None


def _rho(text):
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability in (0, 1) or 'auto', got {text!r}") from None


def _add_sampling(p, chains=4, draws=1000, tune=None):
    g = p.add_argument_group("Gibbs sampling (also the number of stored draws of a VB fit)")
    g.add_argument("--chains", type=_positive_int, default=chains, metavar="N",
                   help=f"independent chains (default {chains})")
    g.add_argument("--draws", type=_positive_int, default=draws, metavar="N",
                   help=f"kept draws per chain (default {draws})")
    g.add_argument("--max-draws", type=_positive_int, default=None, metavar="N",
                   help="Gibbs: continue the chains up to N draws each until R-hat <= 1.01 and bulk ESS >= 400 "
                        "(default 4 x --draws; N = --draws switches this off)")
    g.add_argument("--tune", type=_nonnegative_int, default=tune, metavar="N",
                   help=f"discarded initial draws per chain (default {tune})" if tune is not None else
                   "discarded initial draws per chain (default 1000; 2000 with --prior laplace-zero without "
                   "--missing impute)")
    g.add_argument("--thin", type=_positive_int, default=1, metavar="K", help="keep every K-th draw (default 1)")
    g.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                   help="processes running chains in parallel (default 1; results do not depend on it)")
    g.add_argument("--seed", type=_nonnegative_int, default=1, metavar="S", help="random seed (default 1)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``vbsvm`` command."""
    from vbsvm._version import __version__

    parser = _Parser(prog="vbsvm", description=MAIN_DESCRIPTION, epilog=MAIN_EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"vbsvm {__version__}")
    parser.add_argument("--traceback", action="store_true", help="show Python tracebacks of errors (for bug reports)")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND", parser_class=_Parser)

    # ------------------------------------------------------------------ fit
    p = sub.add_parser("fit", help="fit a model to a CSV file and print its summary (optionally save it)",
                       description="Fit a Bayesian SVM to the data in a CSV file and print the summary table.",
                       epilog=FIT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("formula", help='model formula in quotes, e.g. "y ~ x1 + x2 + (1 | group)", or @FILE to '
                                   'read it from a text file')
    p.add_argument("csv", help="data file: comma-separated, header row, missing values as NA or empty")
    p.add_argument("--method", choices=("vb", "meanfield", "gibbs", "map"), default="vb",
                   help="vb: calibrated fast approximation (EP over a variance grid, default); meanfield: the "
                        "paper's mean-field VB; gibbs: Gibbs sampler (exact, slower); "
                        "map: posterior mode (with a fixed --penalty, the classical SVM)")
    p.add_argument("--penalty", type=_penalty, default="auto", metavar="auto|none|ALPHA",
                   help="'auto' (default): infer the penalty alpha = 1/(4 sigma2_u) with sigma2_u ~ IG(0.01, 0.01); "
                        "'none': vague N(0, 1e8) prior on every coefficient; a number: fixed alpha "
                        "(classical SVM cost C = 1/(2 alpha))")
    p.add_argument("--prior", choices=("laplace-zero",), default=None,
                   help="variable selection with the Laplace-zero (spike and slab) prior")
    p.add_argument("--rho", type=_rho, default=None, metavar="R",
                   help="prior inclusion probability for --prior laplace-zero (default: inferred under a "
                        "Beta(1, m^2) hyperprior; a number fixes it; 'auto' chooses it)")
    p.add_argument("--missing", choices=("drop", "impute", "raise"), default="drop",
                   help="rows with missing predictors: drop them (default), impute them in the model, or stop")
    p.add_argument("--imputation", choices=("conditional", "joint"), default=None,
                   help="with --missing impute: 'conditional' (default: predictors given the observed ones and "
                        "the label, cut from the hinge) or 'joint' (the paper's model)")
    p.add_argument("--level", type=float, default=0.95, metavar="L", help="interval level (default 0.95)")
    p.add_argument("--out", metavar="FILE.nc",
                   help="save the fit (netCDF; read back with vbsvm.load or arviz.from_netcdf)")
    p.add_argument("--sep", default=",", help="field separator of the CSV file (default ',')")
    _add_sampling(p)

    # ------------------------------------------------------------------ compare
    c = sub.add_parser("compare", help="compare saved fits (e.g. VB against Gibbs)",
                       description="Compare fits saved with 'vbsvm fit --out' (or fit.save()): means, sds, "
                                   "accuracy of each marginal, and agreement of the predictions.",
                       epilog=COMPARE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("files", nargs="+", metavar="FILE.nc", help="two or more saved fits of the same model")
    c.add_argument("--names", metavar="A,B", help="comma-separated names of the fits (default: their methods)")
    c.add_argument("--ranef", action="store_true", help="also list every random intercept")
    c.add_argument("--no-lr", action="store_true", help="skip the linear-response sd of VB fits")
    c.add_argument("--forest", metavar="FILE.png", help="save a forest plot of the fits overlaid")
    c.add_argument("--density", metavar="FILE.png", help="save density plots of the fits overlaid")
    c.add_argument("--inclusion", metavar="FILE.png",
                   help="save a bar chart of inclusion probabilities (Laplace-zero fits)")

    # ------------------------------------------------------------------ demo
    d = sub.add_parser("demo",
                       help="fit the toenail random-intercept SVM by VB and by Gibbs and compare them (start here)",
                       description=(
                           "Fit the random-intercept SVM of Luts & Ormerod (2014, Section 4.3),\n"
                           f"  {DEMO_FORMULA}   (penalty=None),\n"
                           "to the bundled toenail data (1908 visits of 294 patients) by variational Bayes and\n"
                           "by Gibbs sampling, and print both summaries and their comparison."),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_sampling(d, chains=DEMO_CHAINS, draws=DEMO_DRAWS, tune=DEMO_TUNE)
    d.add_argument("--forest", metavar="FILE.png", help="also save the forest plot of VB vs Gibbs")
    d.add_argument("--density", metavar="FILE.png", help="also save the density plots of VB vs Gibbs")
    return parser


# ====================================================================== helpers
def _read_csv(path, sep=","):
    import pandas as pd

    if not os.path.exists(path):
        raise CLIError(f"no such file: {path!r}")
    if os.path.isdir(path):
        raise CLIError(f"{path!r} is a directory; give a CSV file")
    try:
        df = pd.read_csv(path, sep=sep)
    except UnicodeDecodeError:
        raise CLIError(f"{path!r} is not a text CSV file (could not decode it as UTF-8)") from None
    except pd.errors.EmptyDataError:
        raise CLIError(f"{path!r} is empty") from None
    except pd.errors.ParserError as exc:
        msg = " ".join(str(exc).split())
        raise CLIError(f"could not read {path!r} as CSV: {msg}") from None
    if df.shape[1] < 2:
        raise CLIError(f"{path!r} has {df.shape[1]} column(s) with separator {sep!r}; "
                       "a response and at least one predictor are needed (wrong --sep?)")
    return df


def _sampling_kwargs(args):
    return {"chains": args.chains, "draws": args.draws, "max_draws": args.max_draws, "tune": args.tune, "thin": args.thin,
            "seed": args.seed, "n_jobs": args.jobs, "progress": not args.no_progress and sys.stderr.isatty()}


def _print(text=""):
    print(text, flush=True)


def _save_plot(obj, path):
    obj.savefig(path)
    _print(f"saved {path}")


# ====================================================================== commands
def _formula(text):
    """The formula argument, read from a file for ``@FILE``, checked against the whitelist."""
    from vbsvm.formula.safety import MAX_FORMULA_LENGTH, check_formula

    if text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read(MAX_FORMULA_LENGTH + 1).strip()  # longer is refused below
        except (OSError, UnicodeDecodeError) as exc:
            raise CLIError(f"cannot read the formula file {path!r} ({exc})") from None
        return check_formula(text, what=f"the formula in {path!r}")
    return check_formula(text)


def cmd_fit(args):
    import vbsvm
    from vbsvm.results.summary import WIDTH

    formula = _formula(args.formula)
    df = _read_csv(args.csv, args.sep)
    kwargs = {"method": args.method, "penalty": args.penalty, "missing": args.missing, "level": args.level,
              **_sampling_kwargs(args)}
    if args.imputation is not None:
        if args.missing != "impute":
            raise CLIError("--imputation chooses the model of --missing impute; add --missing impute")
        kwargs["imputation"] = args.imputation
    if args.rho is not None and args.prior is None:
        raise CLIError("--rho is the prior inclusion probability of --prior laplace-zero; add --prior laplace-zero")
    if args.prior == "laplace-zero":
        kwargs["prior"] = vbsvm.LaplaceZero() if args.rho is None else vbsvm.LaplaceZero(rho=args.rho)
    try:
        fit = vbsvm.svm(formula, data=df, **kwargs)
    except ModuleNotFoundError as exc:
        if not str(getattr(exc, "name", "")).startswith("vbsvm"):
            raise
        feature = "--prior laplace-zero" if "prior" in kwargs else f"--missing {args.missing}"
        raise CLIError(f"{feature} is not available in this installation of vbsvm ({exc})") from None
    _print(fit.summary().as_text())
    if hasattr(fit, "inclusion"):
        _print()
        _print("Inclusion probabilities:")
        _print(fit.inclusion().to_string(float_format=lambda v: f"{v:.4g}", line_width=WIDTH))
    imputed = getattr(fit, "imputed", None)
    if imputed is not None and len(imputed):
        _print()
        _print(f"Imputed {len(imputed)} missing cell(s); first rows of fit.imputed:")
        _print(imputed.head(10).to_string(float_format=lambda v: f"{v:.4g}", line_width=WIDTH))
    if args.out:
        fit.save(args.out)
        _print(f"\nsaved the fit to {args.out} (vbsvm.load({args.out!r}) or arviz.from_netcdf)")
    return 0


def cmd_compare(args):
    import vbsvm

    if len(args.files) < 2:
        raise CLIError("compare needs at least two saved fits, e.g. 'vbsvm compare vb.nc gibbs.nc'")
    names = None
    if args.names:
        names = [s.strip() for s in args.names.split(",")]
    fits = [vbsvm.load(f) for f in args.files]
    if args.inclusion and not any(hasattr(f, "inclusion") for f in fits):
        raise CLIError("--inclusion plots the inclusion probabilities of Laplace-zero fits, and none of "
                       "the files holds one (fit with --prior laplace-zero); leave out --inclusion")
    from vbsvm.results.compare import compare

    cmp = compare(*fits, names=names)
    _print(cmp.to_text(ranef=args.ranef, lr=not args.no_lr))
    _plots(cmp, args)
    return 0


def _plots(cmp, args):
    for kind in ("forest", "density", "inclusion"):
        path = getattr(args, kind, None)
        if path:
            import matplotlib

            matplotlib.use("Agg")
            _save_plot(cmp.plot(kind), path)


def _demo_reading(cmp) -> str:
    """The demo's closing words, read off the comparison table it printed."""
    table = cmp.table()
    name = next(n for n in cmp.fits if n != cmp.reference)
    off = table[f"{name}_diff_sd"].abs()
    ratio = table[f"{name}_sd_ratio"]
    worst, widest = off.idxmax(), (ratio - 1).abs().idxmax()
    return (f"Reading: the fast fit's means are within {off.max():.2f} posterior sds of Gibbs' (largest for\n"
            f"{worst}) and its sds within a factor {ratio.min():.2f}-{ratio.max():.2f} of Gibbs' (furthest for "
            f"{widest}).\nCheck any fast fit with vbsvm.compare() against Gibbs before trusting its intervals;\n"
            "method='meanfield' (the paper's mean-field VB) is faster still and further off.")


def cmd_demo(args):
    import vbsvm
    from vbsvm.results.compare import compare

    toenail = vbsvm.datasets.load("toenail")
    kw = _sampling_kwargs(args)
    _print("vbsvm demo: the random-intercept SVM of Luts & Ormerod (2014, Section 4.3) on the toenail data")
    _print(f"  formula:  {DEMO_FORMULA}")
    _print("  prior:    penalty=None, a vague N(0, 1e8) prior on the fixed effects")
    _print(f"  data:     {len(toenail)} visits of {toenail['patient_id'].nunique()} patients (bundled; "
           "y = 1 for moderate or severe onycholysis)")
    _print(f"  Gibbs:    {kw['chains']} chains x {kw['draws']} draws after {kw['tune']} tuning draws "
           f"(seed {kw['seed']}; set by --chains, --draws, --tune)")
    _print()
    t0 = time.perf_counter()
    vb = vbsvm.svm(DEMO_FORMULA, data=toenail, penalty=None, method="vb", **kw)
    t_vb = time.perf_counter() - t0
    _print("=" * 25 + " 1. the fast approximation (vb) " + "=" * 25)
    _print(vb.summary().as_text())
    t0 = time.perf_counter()
    gibbs = vbsvm.svm(DEMO_FORMULA, data=toenail, penalty=None, method="gibbs", **kw)
    t_gibbs = time.perf_counter() - t0
    _print()
    _print("=" * 30 + " 2. Gibbs sampling " + "=" * 33)
    _print(gibbs.summary().as_text())
    _print()
    _print("=" * 27 + " 3. fast (vb) against Gibbs " + "=" * 27)
    cmp = compare(vb, gibbs)
    _print(cmp.to_text())
    _print()
    _print(f"Time: VB {t_vb:.2f} s, Gibbs {t_gibbs:.1f} s ({kw['chains']} x {gibbs.info.get('draws', kw['draws']) + kw['tune']} sweeps).")
    _print(_demo_reading(cmp))
    _plots(cmp, args)
    return 0


COMMANDS = {"fit": cmd_fit, "compare": cmd_compare, "demo": cmd_demo}


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _one_line(exc) -> str:
    text = " ".join(_ANSI.sub("", str(exc)).split())
    return text or type(exc).__name__


def _show_warning(message, category, filename, lineno, file=None, line=None):
    name = category.__name__
    sys.stderr.write(f"vbsvm: {name}: {_one_line(message)}\n")


def main(argv=None) -> int:
    """Entry point of the ``vbsvm`` command; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    traceback = "--traceback" in argv  # accepted anywhere on the line
    argv = [a for a in argv if a != "--traceback"]
    parser = build_parser()
    old_show = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_ERROR
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        sys.stderr.write("vbsvm: interrupted\n")
        return 130
    except Exception as exc:  # every error is one line unless --traceback
        if traceback:
            raise
        from vbsvm.exceptions import VbsvmError

        if isinstance(exc, (CLIError, VbsvmError)):
            msg = _one_line(exc)
        else:
            msg = f"{type(exc).__name__}: {_one_line(exc)}"
        sys.stderr.write(f"vbsvm: error: {msg}\n")
        return EXIT_ERROR
    finally:
        warnings.showwarning = old_show


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
