"""Suite-wide test settings.

Gibbs fits extend their chains until the summary parameters reach R-hat <= 1.01 and bulk ESS >= 400
(``max_draws``, default ``4 * draws``). The suite's short chains never do, so by default every
test's Gibbs run would be four times as long and of another shape than the test asks for: tests
run with the extension off (``DEFAULT_MAX_DRAWS_FACTOR = 1``), and the tests of the extension
(``tests/test_adaptive_draws.py``) pass ``max_draws`` or set the factor themselves.
"""

import pytest


@pytest.fixture(scope="session", autouse=True)
def _gibbs_runs_as_asked():
    # session scope: module-scoped fixtures that fit models run with it too
    import vbsvm.inference.gibbs as gibbs

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gibbs, "DEFAULT_MAX_DRAWS_FACTOR", 1)
        yield
