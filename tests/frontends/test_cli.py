"""The ``vbsvm`` command line: fit / compare / demo, help texts, and one-line errors with exit 2."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import vbsvm
from vbsvm import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def csv(tmp_path_factory):
    df = vbsvm.datasets.simulate_grouped(12, 5, seed=4)
    df["arm"] = np.where(df["treatment"] == 1, "drug", "placebo")
    path = tmp_path_factory.mktemp("data") / "trial.csv"
    df.to_csv(path, index=False)
    return path


def run(capsys, *argv):
    code = cli.main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, match):
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("vbsvm: error:")]
    assert len(lines) == 1, err
    assert match in lines[0], lines[0]
    assert "Traceback" not in err


# ------------------------------------------------------------------------------ help
def test_help_texts(capsys):
    with pytest.raises(SystemExit) as ex:
        cli.main(["--help"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    for word in ("demo", "fit", "compare", "variational Bayes", "Gibbs"):
        assert word in out
    with pytest.raises(SystemExit):
        cli.main(["fit", "--help"])
    out = capsys.readouterr().out
    for word in ("--method", "--penalty", "--prior", "--rho", "--missing", "--out", "(1 | patient)", "examples:"):
        assert word in out
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    assert "accuracy" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "toenail" in capsys.readouterr().out
    code, out, _ = run(capsys)   # no command: the overview, exit 2
    assert code == 2 and "demo" in out


# ------------------------------------------------------------------------------ fit / compare
def test_fit_prints_summary_and_saves(capsys, csv, tmp_path):
    out_path = tmp_path / "vb.nc"
    code, out, err = run(capsys, "fit", "y ~ time * C(arm) + (1 | group)", csv, "--out", out_path, "--seed", 3)
    assert code == 0, err
    assert "Approximate posterior" in out and "time:C(arm)[T.placebo]" in out and "sigma2_group" in out
    assert f"saved the fit to {out_path}" in out
    back = vbsvm.load(out_path)
    direct = vbsvm.svm("y ~ time * C(arm) + (1 | group)", data=__import__("pandas").read_csv(csv), seed=3)
    np.testing.assert_allclose(back.coef.to_numpy(), direct.coef.to_numpy())


@pytest.mark.slow
def test_fit_gibbs_and_compare(capsys, csv, tmp_path):
    a, b = tmp_path / "a.nc", tmp_path / "b.nc"
    assert run(capsys, "fit", "y ~ time + C(arm)", csv, "--out", a, "--chains", 2, "--draws", 300,
               "--method", "meanfield")[0] == 0
    code, out, err = run(capsys, "fit", "y ~ time + C(arm)", csv, "--method", "gibbs", "--chains", 2,
                         "--draws", 50, "--tune", 100, "--out", b, "--no-progress")
    assert code == 0 and "Gibbs sampling" in out and "r_hat" in out
    assert "DiagnosticWarning" in err       # short chains: the warning is shown, as one line
    png = tmp_path / "forest.png"
    code, out, err = run(capsys, "compare", a, b, "--forest", png, "--names", "mfvb,mcmc")
    assert code == 0, err
    assert "reference: mcmc" in out and "mfvb_accuracy" in out and "mfvb_sd_lr" in out and "agreement" in out
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_prior_and_missing_are_passed_through(capsys, csv, monkeypatch):
    seen = {}

    def fake_svm(formula, data, **kwargs):
        seen.update(kwargs, formula=formula)
        raise vbsvm.exceptions.InputError("stop here")

    monkeypatch.setattr(vbsvm, "svm", fake_svm)
    code, _, err = run(capsys, "fit", "y ~ time", csv, "--prior", "laplace-zero", "--rho", "0.05",
                       "--missing", "impute", "--method", "gibbs", "--draws", 50)
    assert_one_line_error(code, err, "stop here")
    assert seen["missing"] == "impute" and seen["method"] == "gibbs" and seen["draws"] == 50
    assert "imputation" not in seen  # svm's own default (conditional)
    prior = seen["prior"]
    assert type(prior).__name__ == "LaplaceZero" and prior.rho == 0.05
    seen.clear()
    run(capsys, "fit", "y ~ time", csv, "--prior", "laplace-zero", "--rho", "auto")
    assert seen["prior"].rho == "auto"
    seen.clear()
    run(capsys, "fit", "y ~ time", csv, "--penalty", "none")
    assert seen["penalty"] is None and "prior" not in seen
    run(capsys, "fit", "y ~ time", csv, "--penalty", "0.25")
    assert seen["penalty"] == 0.25


def test_fit_output_of_a_selection_fit_fits_100_columns(capsys, tmp_path):
    df = vbsvm.datasets.simulate_sparse(n=120, p=6, k=2, seed=1)
    df = df.rename(columns={c: f"{c}_measured_at_the_first_visit" for c in df.columns if c != "y"})
    df.to_csv(tmp_path / "wide.csv", index=False)
    code, out, err = run(capsys, "fit", "y ~ .", tmp_path / "wide.csv", "--prior", "laplace-zero",
                         "--method", "meanfield")
    assert code == 0, err
    assert "p_positive_if_included" in out and "median_model" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_library_feature_errors_are_one_line(capsys, csv, monkeypatch):
    """A library failure (e.g. a feature not built yet) is one line, not a traceback."""
    def broken(formula, data, **kwargs):
        raise AttributeError("'Summary' object has no attribute 'add_text'")

    monkeypatch.setattr(vbsvm, "svm", broken)
    code, _, err = run(capsys, "fit", "y ~ time", csv, "--prior", "laplace-zero")
    assert_one_line_error(code, err, "AttributeError: 'Summary' object has no attribute 'add_text'")
    with pytest.raises(AttributeError):
        cli.main(["fit", "y ~ time", str(csv), "--traceback"])


@pytest.mark.parametrize("argv, match", [
    (["fit", "y ~ time", "absent.csv"], "no such file: 'absent.csv'"),
    (["fit", "y ~ age", "{csv}"], "'age'"),
    (["fit", "y ~ time +", "{csv}"], "cannot parse the formula"),
    (["fit", "time ~ arm", "{csv}"], "response"),
    (["fit", "y ~ time", "{csv}", "--method", "mcmc"], "invalid choice: 'mcmc'"),
    (["fit", "y ~ time", "{csv}", "--draws", "0"], "--draws"),
    (["fit", "y ~ time", "{csv}", "--penalty", "big"], "--penalty"),
    (["fit", "y ~ time", "{csv}", "--penalty", "-1"], "penalty must be a positive"),
    (["fit", "y ~ time", "{csv}", "--rho", "0.1"], "add --prior laplace-zero"),
    (["fit", "y ~ time", "{csv}", "--level", "2"], "level must be in (0, 1)"),
    (["fit", "y ~ time", "{csv}", "--sep", ";"], "wrong --sep"),
    (["fit", "y ~ time"], "the following arguments are required: csv"),
    (["compare", "{csv}"], "at least two saved fits"),
    (["compare", "{csv}", "{csv}"], "not a netCDF file written by vbsvm"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_errors_are_one_line_exit_2(capsys, csv, argv, match):
    argv = [a.replace("{csv}", str(csv)) for a in argv]
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, match)


def test_version(capsys):
    with pytest.raises(SystemExit) as ex:
        cli.main(["--version"])
    assert ex.value.code == 0 and capsys.readouterr().out.strip() == f"vbsvm {vbsvm.__version__}"


def test_ansi_codes_are_stripped():
    assert cli._one_line(ValueError("bad \x1b[1;31m+\x1b[0m here\nnext")) == "bad + here next"


# ------------------------------------------------------------------------------ demo
@pytest.mark.slow
def test_demo_runs_and_reports_its_settings(capsys, tmp_path):
    assert (cli.DEMO_CHAINS, cli.DEMO_DRAWS, cli.DEMO_TUNE) == (4, 5000, 1000)
    png = tmp_path / "demo.png"
    code, out, err = run(capsys, "demo", "--chains", 2, "--draws", 300, "--tune", 100, "--density", png)
    assert code == 0, err
    assert "2 chains x 300 draws after 100 tuning draws" in out
    for section in ("1. the fast approximation (vb)", "2. Gibbs sampling", "3. fast (vb) against Gibbs",
                    "vb_accuracy", "beta[time:terbinafine]", "sigma2_patient_id", "Time: VB"):
        assert section in out
    # the closing words quote the table: the largest distance of a mean, in Gibbs sds, and its parameter
    table = re.search(r"within (\d+\.\d+) posterior sds of Gibbs. \(largest for\s+(\S+)\)", out)
    assert table and table.group(2) in out.split("Reading:")[0]
    assert max(len(line) for line in out.splitlines()) <= 100
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_console_entry_point_runs_as_a_program():
    """What the installed ``vbsvm`` script does: ``sys.exit(vbsvm.cli:main())``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", "import sys, vbsvm.cli; sys.exit(vbsvm.cli.main())", "fit"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith("vbsvm: error:")


def test_imputation_option_reaches_svm_and_needs_missing_impute(capsys, csv, monkeypatch):
    seen = {}

    def fake_svm(formula, data, **kwargs):
        seen.update(kwargs)
        raise vbsvm.exceptions.InputError("stop here")

    monkeypatch.setattr(vbsvm, "svm", fake_svm)
    code, _, err = run(capsys, "fit", "y ~ time", csv, "--missing", "impute", "--imputation", "joint")
    assert_one_line_error(code, err, "stop here")
    assert seen["imputation"] == "joint"
    code, _, err = run(capsys, "fit", "y ~ time", csv, "--imputation", "joint")
    assert_one_line_error(code, err, "--missing impute")
