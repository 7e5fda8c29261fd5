"""The scikit-learn estimator vbsvm.sklearn.BayesianSVC."""

import importlib
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("sklearn", minversion="1.6")

from sklearn.base import clone  # noqa: E402
from sklearn.datasets import make_circles  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.model_selection import cross_val_score  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.svm import SVC  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

import vbsvm  # noqa: E402
from vbsvm.exceptions import ConvergenceWarning, InputError, InputTypeError
from vbsvm.sklearn import BayesianSVC

#: scikit-learn checks the estimator is expected to fail, and why
EXPECTED_FAILED = {
    "check_decision_proba_consistency": (
        "predict_proba is the posterior predictive Phi(m / sqrt(1 + s^2)) of the score's mean m and "
        "sd s, so its ranking can differ from that of decision_function (m) where s differs; the two "
        "agree on the class (same sign)"
    ),
}


def _expected_failed(estimator):
    return EXPECTED_FAILED


@pytest.fixture(scope="module")
def heart():
    data = vbsvm.datasets.load("raetsch/heart")
    return data.drop(columns="y"), data["y"].to_numpy()


# ---------------------------------------------------------------------------------------------
# scikit-learn's estimator checks
# ---------------------------------------------------------------------------------------------
@parametrize_with_checks([BayesianSVC(seed=0), BayesianSVC(method="meanfield", seed=0),
                          BayesianSVC(method="map", penalty=0.5, seed=0)],
                         expected_failed_checks=_expected_failed)
def test_estimator_checks(estimator, check):
    check(estimator)


@pytest.mark.slow
@parametrize_with_checks([BayesianSVC(method="gibbs", draws=100, tune=100, chains=2, seed=0),
                          BayesianSVC(kernel="rbf", seed=0),
                          BayesianSVC(kernel="rbf", method="svi", n_inducing=16, seed=0),
                          BayesianSVC(kernel="rbf", method="gibbs", n_inducing=16, draws=100, tune=100,
                                      chains=2, seed=0)],
                         expected_failed_checks=_expected_failed)
def test_estimator_checks_slow(estimator, check):
    check(estimator)


# ---------------------------------------------------------------------------------------------
# Pipelines and model selection
# ---------------------------------------------------------------------------------------------
def test_cross_val_score_heart_matches_logistic_regression(heart):
    X, y = heart
    ours = cross_val_score(BayesianSVC(seed=1), X, y, cv=5)
    logistic = cross_val_score(make_pipeline(StandardScaler(), LogisticRegression()), X, y, cv=5)
    assert ours.shape == (5,)
    assert ours.mean() > 0.78
    assert abs(ours.mean() - logistic.mean()) < 0.05


def test_pipeline_with_scaler_and_auc(heart):
    X, y = heart
    model = make_pipeline(StandardScaler(), BayesianSVC(seed=1))
    assert model.fit(X, y).score(X, y) > 0.8
    auc = cross_val_score(model, X, y, cv=3, scoring="roc_auc")
    assert auc.mean() > 0.85


def test_map_with_fixed_penalty_is_the_classical_svm(heart):
    """Posterior mode with alpha fixed == SVC(kernel='linear', C = 1/(2 alpha)): same scores."""
    X, y = heart
    Xs = StandardScaler().fit_transform(X)
    alpha = 0.5
    ours = BayesianSVC(method="map", penalty=alpha,
                       options={"standardize": False, "tol": 1e-12, "max_iter": 5000}).fit(Xs, y)
    svc = SVC(kernel="linear", C=1 / (2 * alpha), tol=1e-8).fit(Xs, y)
    np.testing.assert_allclose(ours.decision_function(Xs), svc.decision_function(Xs), atol=1e-4)
    np.testing.assert_array_equal(ours.predict(Xs), svc.predict(Xs))


@pytest.mark.filterwarnings("ignore::vbsvm.exceptions.ConvergenceWarning")  # the linear fit: no boundary
def test_kernel_wraps_gpsvm_and_learns_a_nonlinear_boundary():
    X, y = make_circles(200, noise=0.1, factor=0.4, random_state=0)
    gp = BayesianSVC(kernel="rbf", n_inducing=20, seed=0).fit(X, y)
    linear = BayesianSVC(seed=0).fit(X, y)
    assert isinstance(gp.fit_, vbsvm.GPFit)
    assert gp.score(X, y) > 0.9
    assert linear.score(X, y) < 0.7


# ---------------------------------------------------------------------------------------------
# Predictions, labels and column names
# ---------------------------------------------------------------------------------------------
def test_predict_proba_rows_sum_to_one_and_agree_with_the_fit(heart):
    X, y = heart
    est = BayesianSVC(seed=1).fit(X, y)
    proba = est.predict_proba(X)
    assert proba.shape == (len(y), 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert np.all((proba > 0) & (proba < 1))
    np.testing.assert_allclose(proba[:, 1], est.fit_.predict(X, kind="prob").to_numpy())
    np.testing.assert_array_equal(est.predict(X), est.classes_[proba.argmax(axis=1)])
    np.testing.assert_array_equal(est.predict(X) == est.classes_[1], est.decision_function(X) > 0)


def test_string_labels_follow_classes_order(heart):
    """Swapping the label names mirrors the probabilities: column j is P(y = classes_[j])."""
    X, y = heart
    names = np.where(y > 0, "sick", "healthy")
    swapped = np.where(y > 0, "healthy", "sick")
    a = BayesianSVC(seed=1).fit(X, names)
    b = BayesianSVC(seed=1).fit(X, swapped)
    assert a.classes_.tolist() == ["healthy", "sick"] == b.classes_.tolist()
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X)[:, ::-1], atol=1e-6)
    assert np.mean(a.predict(X) == names) > 0.8
    assert a.fit_.design.positive_level == 1


def test_frame_column_names_are_used(heart):
    X, y = heart
    est = BayesianSVC(seed=1).fit(X, y)
    assert est.feature_names_in_.tolist() == X.columns.tolist()
    assert est.fit_.coef.index.tolist() == ["Intercept"] + X.columns.tolist()
    with pytest.raises(ValueError, match="feature names"):
        est.predict(X[X.columns[::-1]])


def test_awkward_column_names_fall_back_to_positional_names():
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.normal(size=(80, 3)), columns=["Intercept", "a b", "y"])
    y = (X["a b"] + 0.5 * rng.normal(size=80) > 0).astype(int)
    est = BayesianSVC(seed=0).fit(X, y)
    assert est.fit_.coef.index.tolist() == ["Intercept", "x0", "x1", "x2"]
    assert est.score(X, y) > 0.8


def test_a_feature_named_y_does_not_clash_with_the_response():
    rng = np.random.default_rng(1)
    X = pd.DataFrame(rng.normal(size=(80, 2)), columns=["y", "z"])
    y = (X["y"] + 0.5 * rng.normal(size=80) > 0).astype(int)
    est = BayesianSVC(seed=0).fit(X, y)
    assert est.fit_.coef.index.tolist() == ["Intercept", "y", "z"]
    assert est.fit_.coef.loc["y", "mean"] > 3 * abs(est.fit_.coef.loc["z", "mean"])


def test_inputs_are_not_modified(heart):
    X, y = heart
    X_before, y_before = X.copy(), y.copy()
    arr = X.to_numpy().copy()
    BayesianSVC(seed=1).fit(X, y).predict(X)
    BayesianSVC(seed=1).fit(arr, y)
    pd.testing.assert_frame_equal(X, X_before)
    np.testing.assert_array_equal(y, y_before)
    np.testing.assert_array_equal(arr, X_before.to_numpy())


def test_same_seed_same_gibbs_fit(heart):
    X, y = heart
    est = BayesianSVC(method="gibbs", draws=50, tune=50, chains=2, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short chains: R-hat warnings
        a = clone(est).fit(X, y).decision_function(X)
        b = clone(est).fit(X, y).decision_function(X)
        c = clone(est).set_params(seed=4).fit(X, y).decision_function(X)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
def test_get_params_set_params_clone_round_trip(heart):
    X, y = heart
    est = BayesianSVC(method="map", penalty=0.25, draws=10, tune=5, chains=1, seed=7,
                      options={"max_iter": 300})
    params = est.get_params()
    assert params == {"method": "map", "penalty": 0.25, "kernel": None, "n_inducing": None, "draws": 10,
                      "tune": 5, "chains": 1, "seed": 7, "progress": False, "options": {"max_iter": 300}}
    est.fit(X, y)
    copy = clone(est)
    assert copy.get_params() == params
    assert not hasattr(copy, "fit_")
    assert copy.set_params(penalty=1.0, method="meanfield") is copy
    assert copy.get_params()["penalty"] == 1.0 and est.get_params()["penalty"] == 0.25
    np.testing.assert_array_equal(clone(est).fit(X, y).decision_function(X), est.decision_function(X))


def test_options_reach_the_wrapped_function(heart):
    X, y = heart
    with pytest.warns(ConvergenceWarning):
        BayesianSVC(method="meanfield", options={"max_iter": 2, "accelerate": False}).fit(X, y)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"n_inducing": 10}, InputError, "n_inducing=10 applies to the GP SVM only"),
    ({"kernel": "rbf", "penalty": 0.5}, InputError, "penalty=0.5 applies to the linear SVM only"),
    ({"options": {"seed": 1}}, InputError, r"options may not set \['seed'\]"),
    ({"options": [("max_iter", 3)]}, InputTypeError, "options must be a dict"),
    ({"method": "svi"}, InputError, "method"),
    ({"kernel": "rbf", "method": "map"}, InputError, "method"),
])
def test_bad_parameters_raise_in_fit_naming_the_argument(kwargs, error, match):
    est = BayesianSVC(**kwargs)  # stored unchecked, as scikit-learn requires
    X = np.random.default_rng(0).normal(size=(30, 2))
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(error, match=match):
        est.fit(X, y)


def test_more_than_two_classes_is_a_clear_error():
    X = np.random.default_rng(0).normal(size=(30, 2))
    with pytest.raises(InputError, match="exactly 2 classes, got 3.*OneVsRestClassifier"):
        BayesianSVC().fit(X, np.arange(30) % 3)


# ---------------------------------------------------------------------------------------------
# Optional dependency
# ---------------------------------------------------------------------------------------------
def test_import_vbsvm_does_not_import_the_estimator():
    code = "import sys, vbsvm; print('vbsvm.sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_scikit_learn_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.base", None)
    monkeypatch.delitem(sys.modules, "vbsvm.sklearn")
    with pytest.raises(ImportError, match="pip install scikit-learn"):
        importlib.import_module("vbsvm.sklearn")
