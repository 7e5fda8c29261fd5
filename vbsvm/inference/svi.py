"""Stochastic VI for the sparse-GP SVM (Algorithm 1 of Wenzel et al. 2017): the natural-gradient
loop, step-size schedules, minibatch sources and Adam steps on the hyperparameters.

The engine owns the loop; the model object it is given (``blocks``, an
:class:`vbsvm.models.gp.InducingGP` or anything with the same methods) supplies the pieces:
``project(X) -> (A, kt)``, the local update ``local(A, kt, y, q) -> (alpha, fbar)``, the global
target ``target(A, y, alpha, scale) -> (precision, shift)``, ``gaussian(precision, shift)`` and
``prior_q()`` for q(v), the ELBO pieces ``data_elbo``, ``elbo`` and ``q.kl_to_std()``, and for
hyperparameter learning ``hyper_grad``, ``kernel.theta``, ``Z``, ``L``, ``refresh()`` and
``rewhiten(q, L_old)``.  This module imports no model.

Batch VB *is* the natural-gradient update with step 1 on the full data (for conjugate blocks the
natural gradient is ``eta_hat - eta`` and a unit step lands on the coordinate-ascent optimum);
it runs on :func:`vbsvm.inference.vb.coordinate_ascent` with
:class:`vbsvm.models.gp.SparseGPSVM`.  SVI takes the same step on a minibatch (scaled by
``n / batch``) with a step size ``rho_t`` in (0, 1]:

* ``step="adaptive"`` (default): the adaptive learning rate of Ranganath et al. (2013), which the
  paper uses, ``rho_t = |g_bar|^2 / h_bar`` with running averages of the natural gradient and of
  its squared norm, clipped to ``[rho_min, 1]``;
* ``step="robbins-monro"``: ``rho_t = (t + tau0)^(-kappa)``;
* a float: a constant step.

Safety of the natural-gradient step: the update is done in whitened coordinates, where the
precision of q(v) is a convex combination of matrices ``>= I``, so it is positive definite for any
rho in (0, 1]. The Cholesky factorization is still guarded: a non-finite target (from an
extreme minibatch) is skipped, and a failed factorization halves rho and retries (up to 6 times)
before the minibatch is skipped; skipped steps are counted in the result.

Memory: the SVI loop holds q (O(m^2)), up to ``average_windows`` window sums (O(m^2) each), one minibatch projection (O(batch * m)), the kernel's
hyperparameters and Adam moments; minibatches are drawn with replacement (O(batch) indices) or
streamed from an iterator, so nothing of size n is allocated besides the data itself.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from vbsvm.exceptions import ConvergenceWarning, InputError
from vbsvm.inference.progress import progress_bar

__all__ = ["AdaptiveStep", "RobbinsMonro", "ConstantStep", "make_step", "Adam",
           "ArrayBatches", "StreamBatches", "FitState", "fit_svi"]


# ---------------------------------------------------------------------------------------------
# Step sizes
# ---------------------------------------------------------------------------------------------
class AdaptiveStep:
    """Adaptive learning rate of Ranganath, Wang, Blei & Xing (2013).

    Parameters
    ----------
    tau0 : float
        Initial memory (number of steps averaged).
    rho_min : float
        Lower clip (keeps SVI moving when the running averages are dominated by noise).
    """

    def __init__(self, tau0: float = 10.0, rho_min: float = 1e-3):
        self.tau = tau0
        self.rho_min = rho_min
        self.gbar = None
        self.hbar = None

    def __call__(self, g: np.ndarray) -> float:
        if self.gbar is None:
            self.gbar = g.copy()
            self.hbar = float(g @ g)
            return 1.0
        a = 1.0 / self.tau
        self.gbar *= (1.0 - a)
        self.gbar += a * g
        self.hbar = (1.0 - a) * self.hbar + a * float(g @ g)
        rho = float(self.gbar @ self.gbar) / max(self.hbar, 1e-300)
        rho = min(max(rho, self.rho_min), 1.0)
        self.tau = self.tau * (1.0 - rho) + 1.0
        return rho


class RobbinsMonro:
    """rho_t = (t + tau0)^(-kappa), kappa in (0.5, 1]."""

    def __init__(self, tau0: float = 1.0, kappa: float = 0.6):
        self.t, self.tau0, self.kappa = 0, tau0, kappa

    def __call__(self, g=None) -> float:
        self.t += 1
        return min(1.0, (self.t + self.tau0 - 1.0) ** (-self.kappa))


class ConstantStep:
    def __init__(self, rho: float):
        if not 0 < rho <= 1:
            raise InputError(f"step={rho!r}: a constant step must be in (0, 1]")
        self.rho = rho

    def __call__(self, g=None) -> float:
        return self.rho


def make_step(step):
    """Step-size schedule from ``"adaptive"``, ``"robbins-monro"``, a float or an object."""
    if callable(step):
        return step
    if isinstance(step, str):
        if step == "adaptive":
            return AdaptiveStep()
        if step in ("robbins-monro", "rm"):
            return RobbinsMonro()
        raise InputError(f"step={step!r}; use 'adaptive', 'robbins-monro' or a float in (0, 1]")
    return ConstantStep(float(step))


class Adam:
    """Adam ascent on a flat parameter vector (hyperparameters on the log scale)."""

    def __init__(self, lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8, max_step=0.5):
        self.lr, self.b1, self.b2, self.eps, self.max_step = lr, beta1, beta2, eps, max_step
        self.m = self.v = None
        self.t = 0

    def step(self, x, g):
        if self.m is None:
            self.m = np.zeros_like(g)
            self.v = np.zeros_like(g)
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * g
        self.v = self.b2 * self.v + (1 - self.b2) * g * g
        mh = self.m / (1 - self.b1 ** self.t)
        vh = self.v / (1 - self.b2 ** self.t)
        d = np.clip(self.lr * mh / (np.sqrt(vh) + self.eps), -self.max_step, self.max_step)
        return x + d


# ---------------------------------------------------------------------------------------------
# Minibatch sources
# ---------------------------------------------------------------------------------------------
class ArrayBatches:
    """Minibatches drawn uniformly with replacement from in-memory arrays (O(batch) memory)."""

    def __init__(self, X, y, batch_size, rng):
        self.X, self.y = X, y
        self.n = X.shape[0]
        self.b = min(int(batch_size), self.n)
        self.rng = rng

    def __iter__(self):
        while True:
            idx = np.sort(self.rng.integers(0, self.n, self.b))
            yield self.X[idx], self.y[idx]


class StreamBatches:
    """Minibatches from a re-iterable source of chunks (larger-than-memory data).

    Parameters
    ----------
    factory : callable
        ``factory()`` returns a fresh iterator over chunks ``(X, y)`` (arrays); it is called
        once per pass (epoch).  Each chunk is shuffled and cut into minibatches.
    n : int
        Total number of rows (for the ``n / batch`` scaling).
    """

    def __init__(self, factory, n, batch_size, rng):
        self.factory, self.n, self.b, self.rng = factory, int(n), int(batch_size), rng
        self.epochs = 0

    def __iter__(self):
        while True:
            got = False
            for X, y in self.factory():
                X = np.asarray(X, float)
                y = np.asarray(y, float)
                perm = self.rng.permutation(X.shape[0])
                for s in range(0, X.shape[0] - self.b + 1, self.b):
                    got = True
                    idx = perm[s:s + self.b]
                    yield X[idx], y[idx]
            self.epochs += 1
            if not got:
                raise InputError("the data stream yielded no chunk with at least batch_size rows")


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
@dataclass
class FitState:
    """What an engine returns."""

    q: object
    blocks: object
    elbo: np.ndarray
    elbo_iter: np.ndarray
    theta_trace: np.ndarray
    n_iter: int
    converged: bool
    seconds: float
    rho: np.ndarray = field(default_factory=lambda: np.zeros(0))
    skipped: int = 0
    method: str = "vb"


# ---------------------------------------------------------------------------------------------
# Stochastic VI (Algorithm 1)
# ---------------------------------------------------------------------------------------------
def _natural_step(blocks, q, A, kt, yb, scale, sched):
    """One natural-gradient step of q(u) on a minibatch (projection ``A``, ``kt`` of its rows):
    ``(q_new, rho)``, the step halved (at most 7 times) until the new precision is PD with a finite
    mean; None when the minibatch target is not finite or no step is PD."""
    alpha, _ = blocks.local(A, kt, yb, q)
    P_hat, h_hat = blocks.target(A, yb, alpha, scale)
    if not (np.all(np.isfinite(P_hat)) and np.all(np.isfinite(h_hat))):
        return None
    g = np.concatenate([h_hat - q.shift, 0.5 * (P_hat - q.prec).ravel()])
    rho = sched(g)
    for _ in range(7):
        P = (1.0 - rho) * q.prec + rho * P_hat
        h = (1.0 - rho) * q.shift + rho * h_hat
        q_new = blocks.gaussian(P, h)
        try:
            q_new.chol
            if np.all(np.isfinite(q_new.mean)):
                return q_new, rho
        except np.linalg.LinAlgError:
            pass
        rho *= 0.5
    return None


def _hyper_step(blocks, q, adam, gth, gZ, inducing):
    """One Adam step on the log-hyperparameters (clipped to [-12, 12]) and, with ``inducing``, the
    inducing locations; q is rewhitened to the new frame. Returns ``(q, theta, ok)`` with ``theta``
    the stepped log-hyperparameters; where the new kernel matrix is not PD the old hyperparameters
    are restored and ``ok`` is False."""
    L_old = blocks.L
    th_old, Z_old = blocks.kernel.theta, blocks.Z.copy()
    x = np.concatenate([th_old, Z_old.ravel()]) if inducing else th_old
    gg = np.concatenate([gth, gZ.ravel()]) if inducing else gth
    x = adam.step(x, gg)
    blocks.kernel.theta = np.clip(x[:th_old.size], -12, 12)
    if inducing:
        blocks.Z = x[th_old.size:].reshape(Z_old.shape)
    theta = blocks.kernel.theta
    try:
        blocks.refresh()
        q = blocks.rewhiten(q, L_old)
        q.chol
    except np.linalg.LinAlgError:
        blocks.kernel.theta, blocks.Z = th_old, Z_old
        blocks.refresh()
        return q, theta, False
    return q, theta, True


class _TailWindows:
    """Sums of the natural parameters of q(u) over the steps of each check window, for the
    Polyak-Ruppert tail average of :func:`fit_svi`: the current window (``P``, ``h``, ``k``
    steps) and the last completed ones since the hyperparameters last moved (``done``)."""

    def __init__(self, m):
        self.m = m
        self.P, self.h, self.k = np.zeros((m, m)), np.zeros(m), 0
        self.done = []
        self.moved = False  # hyperparameters changed in the current window

    def add(self, q):
        """Add the step's q to the current window."""
        self.P += q.prec
        self.h += q.shift
        self.k += 1

    def close(self, keep):
        """End the current window: keep it (with at most ``keep`` windows) unless the
        hyperparameters moved during it, which drops them all."""
        self.done = [] if self.moved else (self.done + [(self.P, self.h, self.k)])
        self.done = self.done[-keep:]
        self.P, self.h, self.k = np.zeros((self.m, self.m)), np.zeros(self.m), 0
        self.moved = False

    def average(self, blocks):
        """q(u) with the average natural parameters of the completed windows (a convex
        combination of PD precisions, so PD), or None if they hold no step."""
        P_sum = sum(w[0] for w in self.done)
        h_sum = sum(w[1] for w in self.done)
        k_sum = sum(w[2] for w in self.done)
        if k_sum == 0:
            return None
        q_avg = blocks.gaussian(P_sum / k_sum, h_sum / k_sum)
        try:
            q_avg.chol
        except np.linalg.LinAlgError:  # pragma: no cover - convex combination of PD
            return None
        return q_avg


def _check_schedule(source, n, check_every, min_iter, hyper_warmup, hyper_every):
    """``(check_every, min_iter, hyper_warmup)`` of :func:`fit_svi`, the defaults filled in
    (``hyper_every``: the steps between hyperparameter steps, None without them)."""
    if check_every is None:
        b = getattr(source, "b", None)
        check_every = max(20, min(n // max(b or 100, 1), 500))
        if hyper_every is not None:  # at least 5 hyperparameter steps per check window
            check_every = max(check_every, 5 * hyper_every)
    if min_iter is None:
        min_iter = 2 * check_every
    if hyper_warmup is None:
        hyper_warmup = check_every
    return check_every, min_iter, hyper_warmup


def _check_elbo(blocks, q, monitor, n, step):
    """The ELBO at a check: exact on the ``monitor`` rows (scaled to ``n``), else the minibatch
    estimate of the ``step``'s ``(A, kt, y, scale)``."""
    if monitor is not None:
        Xm, ym = monitor
        return blocks.elbo(Xm, ym, q, scale=n / Xm.shape[0])
    A, kt, yb, scale = step
    c, fbar = blocks.local(A, kt, yb, q)
    return scale * blocks.data_elbo(yb, fbar, c) - q.kl_to_std()


def fit_svi(blocks, source, n: int, *, max_iter=20000, step="adaptive", tol=1e-4,
            check_every=None, patience=3, optimize=False, hyper_every=10, hyper_lr=0.1,
            hyper_warmup=None, optimize_inducing=False, monitor=None, min_iter=None,
            q=None, callback=None, hyper_mask=None, average=True,
            average_windows=10, theta_tol=None, progress=False) -> FitState:
    """Inducing-point SVI: natural-gradient steps on minibatches, optional Adam hyper steps.

    Parameters
    ----------
    blocks : vbsvm.models.gp.InducingGP
        The model (see the module docstring for the methods used).
    source : iterable of (X_batch, y_batch)
        E.g. :class:`ArrayBatches` or :class:`StreamBatches`; infinite.
    n : int
        Number of training rows (minibatch terms are scaled by ``n / batch``).
    max_iter : int
        Maximum number of minibatch steps.
    step : {"adaptive", "robbins-monro"} or float or callable
    tol : float
        Convergence: relative change of the monitor ELBO below ``tol`` for ``patience``
        consecutive checks, and (with ``optimize``) the window averages of the
        log-hyperparameters moved by less than ``theta_tol`` (default ``50 * tol``) between
        consecutive check windows (Adam's steps are noisy, so single iterates are not compared).
    check_every : int or None
        Steps between checks (default ``max(20, min(n // batch, 500))``).
    optimize : bool
        Alternate ``hyper_every`` variational steps with one Adam step (rate ``hyper_lr``) on the
        log-hyperparameters (Section 4.3, eq. 12), using the minibatch gradient at fixed q(u).
    hyper_mask : array of 0/1 or None
        Which log-hyperparameters to learn (others stay fixed).
    hyper_warmup : int or None
        Variational steps before the first hyper step (default ``check_every``).
    optimize_inducing : bool
        Also move the inducing locations with Adam.
    monitor : (X, y) or None
        Rows on which the ELBO is evaluated exactly at each check (scaled to n).
    min_iter : int or None
        Never stop before this many steps (default ``2 * check_every``).
    average : bool
        Polyak-Ruppert tail averaging: return the average of the natural parameters over the
        last ``average_windows`` check windows, at most the second half of the run (a convex
        combination, so still PD).  This removes most of the
        minibatch noise left at the final step size.  Used only when the hyperparameters were
        fixed during those windows (the whitened frame must not change).
    progress : bool
        Show a progress bar of the steps (out of ``max_iter``; see :mod:`vbsvm.inference.progress`).

    Returns
    -------
    FitState
    """
    t0 = time.perf_counter()
    q = blocks.prior_q() if q is None else q
    sched = make_step(step)
    it_src = iter(source)
    check_every, min_iter, hyper_warmup = _check_schedule(source, n, check_every, min_iter, hyper_warmup,
                                                          hyper_every if optimize else None)
    adam = Adam(lr=hyper_lr)
    elbos, elbo_at, thetas, rhos = [], [], [blocks.kernel.theta], []
    skipped = 0
    calm = 0
    converged = False
    t = 0
    windows = _TailWindows(blocks.m)
    th_sum, th_k, prev_theta_mean = np.zeros(blocks.kernel.n_params), 0, None
    bar = progress_bar(max_iter, "SVI steps", progress)
    for t in range(1, max_iter + 1):
        if bar is not None:
            bar.update()
        Xb, yb = next(it_src)
        scale = n / Xb.shape[0]
        A, kt = blocks.project(Xb)
        stepped = _natural_step(blocks, q, A, kt, yb, scale, sched)
        if stepped is None:
            skipped += 1
            continue
        q, rho = stepped
        rhos.append(rho)
        if average:
            windows.add(q)
        if optimize and t >= hyper_warmup and t % hyper_every == 0:
            gth, gZ = blocks.hyper_grad(Xb, yb, q, scale=scale, inducing=optimize_inducing)
            if hyper_mask is not None:
                gth = gth * hyper_mask
            if np.all(np.isfinite(gth)):
                q, theta, ok = _hyper_step(blocks, q, adam, gth, gZ, optimize_inducing)
                windows.moved = True
                th_sum += theta
                th_k += 1
                skipped += not ok
        if t % check_every == 0:
            thetas.append(blocks.kernel.theta)
            val = _check_elbo(blocks, q, monitor, n, (A, kt, yb, scale))
            if elbos:
                rel = abs(val - elbos[-1]) / max(abs(val), 1e-12)
                dth = 0.0
                if optimize and prev_theta_mean is not None and th_k > 0:
                    dth = float(np.max(np.abs(th_sum / th_k - prev_theta_mean)))
                ok = rel < tol and dth < (50 * tol if theta_tol is None else theta_tol)
                calm = calm + 1 if ok else 0
            elbos.append(val)
            elbo_at.append(t)
            if optimize and th_k > 0:
                prev_theta_mean = th_sum / th_k
                th_sum, th_k = np.zeros_like(th_sum), 0
            if average:
                windows.close(max(1, min(average_windows, len(elbos) // 2)))
            if callback is not None:
                callback(t, q, blocks)
            if calm >= patience and t >= min_iter:
                converged = True
                break
    if bar is not None:
        bar.close()
    q_avg = windows.average(blocks) if average and windows.done and windows.k == 0 else None
    if q_avg is not None:
        q = q_avg
        if monitor is not None:
            Xm, ym = monitor
            elbos.append(blocks.elbo(Xm, ym, q, scale=n / Xm.shape[0]))
            elbo_at.append(t)
    if not converged:
        warnings.warn(f"SVI stopped at max_iter={max_iter} before the monitored ELBO settled "
                      f"(tol={tol:g}); increase max_iter or tol", ConvergenceWarning, stacklevel=3)
    return FitState(q=q, blocks=blocks, elbo=np.asarray(elbos), elbo_iter=np.asarray(elbo_at),
                    theta_trace=np.asarray(thetas), n_iter=t, converged=converged,
                    seconds=time.perf_counter() - t0, rho=np.asarray(rhos), skipped=skipped,
                    method="svi")
