"""Suite-wide test settings and shared fixtures.

Gibbs fits extend their chains until the summary parameters reach R-hat <= 1.01 and bulk ESS >= 400
(``max_draws``, default ``4 * draws``). The suite's short chains never do, so by default every
test's Gibbs run would be four times as long and of another shape than the test asks for: tests
run with the extension off (``DEFAULT_MAX_DRAWS_FACTOR = 1``), and the tests of the extension
(``tests/test_adaptive_draws.py``) pass ``max_draws`` or set the factor themselves.

Likewise the cut Gibbs sampler of ``missing="impute"`` runs ``CUT_SVM_SWEEPS = 20`` SVM sweeps per
draw of the imputations by default (the bias of fewer is measured on acath, see
:class:`vbsvm.models.missing.CutImputedSVMModel`), which doubled the imputation tests' time; the
suite runs 1 (the naive cut algorithm: the tests check correctness of the moves, not the bias of too few sweeps), the tests of the inner sweeps set their own number, and the slow acath check
(``tests/test_missing.py``, ``-m slow``) runs the default.
"""

import os

import pytest

#: BLAS threads of each test process and of the subprocesses it starts (vignettes, spawned chains):
#: the suite runs two xdist workers on two cores, and two OpenBLAS threads per worker
#: oversubscribe them (see :mod:`vbsvm.inference.threads`). Set before numpy is imported.
SUITE_BLAS_THREADS = "1"
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, SUITE_BLAS_THREADS)

#: SVM sweeps per draw of the imputations in the suite's cut Gibbs runs (see above)
SUITE_CUT_SVM_SWEEPS = 1


@pytest.fixture(scope="session", autouse=True)
def _gibbs_runs_as_asked():
    # session scope: module-scoped fixtures that fit models run with it too
    import vbsvm.fitting.builders as fitting
    import vbsvm.inference.gibbs as gibbs

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gibbs, "DEFAULT_MAX_DRAWS_FACTOR", 1)
        patch.setattr(fitting, "CUT_SVM_SWEEPS", SUITE_CUT_SVM_SWEEPS)
        yield


@pytest.fixture(scope="session")
def toenail():
    """The toenail data (Luts & Ormerod Section 4.3), loaded once."""
    import vbsvm

    return vbsvm.datasets.load("toenail")


@pytest.fixture
def one_blas_thread():
    """Run a test with one BLAS thread: the matrices here are small, and on a machine with few
    cores and other work running OpenBLAS's thread pools oversubscribe the cores
    (``benchmarks/results/tuning_constants.md``, "BLAS threads in the hot loops")."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


@pytest.fixture
def block_phases(monkeypatch):
    """The phase of the linear sampler's block tuner
    (:class:`vbsvm.mcmc.block_tuner.BlockTuner`) in every chain at the end of tuning (a list;
    its ``surrogates`` attribute: the HMC trajectory surrogate each chain kept)."""
    from vbsvm.mcmc.block_tuner import BlockTuner

    class Seen(list):
        surrogates: list

    seen = Seen()
    seen.surrogates = []
    adapt = BlockTuner.adapt

    def spy(self, state, block, it, tune, mismatch=None):
        out = adapt(self, state, block, it, tune, mismatch)
        if it == tune - 1:
            seen.append(BlockTuner.phase(out))
            seen.surrogates.append(BlockTuner.surrogate(out))
        return out

    monkeypatch.setattr(BlockTuner, "adapt", spy)
    return seen
