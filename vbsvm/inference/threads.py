"""BLAS thread limits for the hot loops.

The products inside a VB sweep or a Gibbs scan are small (a q x q Gram matrix of a tall-skinny
design, a Cholesky of order q or m). For such products, BLAS threads cost more in
synchronisation than they save, and on a machine with other work running they make the loops
several times slower (measurements in ``benchmarks/results/tuning_constants.md``). So the engines
run with one BLAS thread unless one product is large enough for threads to pay (``work`` = flops
of the largest product, >= 1e9).
"""

from contextlib import nullcontext
from functools import lru_cache

from threadpoolctl import ThreadpoolController

__all__ = ["limit_blas", "LARGE_WORK"]

#: flops of one hot-loop product above which BLAS keeps its own thread count
LARGE_WORK = 1e9


@lru_cache(maxsize=1)
def _controller() -> ThreadpoolController:
    # Inspecting the loaded BLAS libraries is not free; do it once per process.
    return ThreadpoolController()


def limit_blas(work: float):
    """Context manager: one BLAS thread if ``work < LARGE_WORK``, otherwise no change."""
    return _controller().limit(limits=1, user_api="blas") if work < LARGE_WORK else nullcontext()
