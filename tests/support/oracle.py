"""Plain transcriptions of the paper's algorithms, kept as test oracles.

Written directly from Luts & Ormerod (2014), Algorithms 1 and 2, with dense matrices and no
structure or acceleration, so that they are easy to check against the paper line by line.
"""

import numpy as np
from scipy.special import gammaln, kve


def algorithm2(C, y, p, sigma2_beta=1e8, A=0.01, B=0.01, groups=None, iters=5000, tol=1e-14, init=None):
    """Algorithm 2 with C = [X, Z]: the first ``p`` columns have the N(0, sigma2_beta) prior.

    ``groups`` lists the column blocks of Z that share one variance (each with its own
    IG(A, B) prior; the paper has one block, we allow several as the package does).
    ``init = (mu_q(1/a), mu_q(1/sigma^2))`` starts the iterations elsewhere than at ones (to check
    that a given q is a fixed point). Returns mu, Sigma, B_q and the trace of the paper's bound.
    ``dg(C Sigma C^T)`` is computed row by row with einsum rather than forming an n x n matrix.
    """
    n, q = C.shape
    groups = groups if groups is not None else [np.arange(p, q)]
    mu_inv_a, mu_inv_sigma = (np.ones(n), np.ones(len(groups))) if init is None else map(np.array, init)
    trace = []
    for _ in range(iters):
        prior = np.full(q, 1.0 / sigma2_beta)
        for k, g in enumerate(groups):
            prior[g] = mu_inv_sigma[k]
        Sigma = np.linalg.inv(C.T @ (mu_inv_a[:, None] * C) + np.diag(prior))
        mu = Sigma @ C.T @ ((1 + mu_inv_a) * y)
        chi = (1 - y * (C @ mu)) ** 2 + np.einsum("ij,jk,ik->i", C, Sigma, C)
        mu_inv_a = chi ** -0.5
        Bq = np.array([B + 0.5 * (mu[g] @ mu[g] + np.trace(Sigma[np.ix_(g, g)])) for g in groups])
        m = np.array([len(g) for g in groups])
        mu_inv_sigma = (A + m / 2) / Bq
        # The paper's simplified bound (valid right after the updates).
        bound = ((p + m.sum()) / 2 - n + n * np.log(2) - n / 2 * np.log(2 * np.pi)
                 - p / 2 * np.log(sigma2_beta) + 0.5 * np.linalg.slogdet(Sigma)[1]
                 - (mu[:p] @ mu[:p] + np.trace(Sigma[:p, :p])) / (2 * sigma2_beta)
                 + np.sum(A * np.log(B) - gammaln(A) - (A + m / 2) * np.log(Bq) + gammaln(A + m / 2))
                 + y @ C @ mu + 0.25 * np.sum(np.log(chi))
                 + np.sum(np.log(kve(0.5, np.sqrt(chi))) - np.sqrt(chi)))
        trace.append(bound)
        if len(trace) > 1 and abs(trace[-1] - trace[-2]) < tol * abs(trace[-1]):
            break
    return mu, Sigma, Bq, np.array(trace)


def algorithm1(X, y, alpha, iters=5000, tol=1e-14):
    """Algorithm 1 (fixed penalty alpha on every column of X) and the paper's bound."""
    n, p = X.shape
    mu_inv_a = np.ones(n)
    trace = []
    for _ in range(iters):
        W = np.diag(mu_inv_a)
        Sigma = np.linalg.inv(X.T @ W @ X + 4 * alpha * np.eye(p))
        mu = Sigma @ X.T @ (np.eye(n) + W) @ y
        chi = (1 - y * (X @ mu)) ** 2 + np.diag(X @ Sigma @ X.T)
        mu_inv_a = chi ** -0.5
        bound = (p / 2 - n + n * np.log(2) - n / 2 * np.log(2 * np.pi) + p / 2 * np.log(4 * alpha)
                 + 0.5 * np.linalg.slogdet(Sigma)[1] - 2 * alpha * (mu @ mu + np.trace(Sigma))
                 + y @ X @ mu + 0.25 * np.sum(np.log(chi)) + np.sum(np.log(kve(0.5, np.sqrt(chi))) - np.sqrt(chi)))
        trace.append(bound)
        if len(trace) > 1 and abs(trace[-1] - trace[-2]) < tol * abs(trace[-1]):
            break
    return mu, Sigma, np.array(trace)


def vb_iteration_random_effects(C, y, tau, ig_groups, iw_groups, mu_inv_a, mu_inv_sigma, mu_inv_Sigma,
                                A=0.01, B=0.01, iw_df=None, iw_scale=None):
    """One pass of Algorithm 2 extended to random-effect terms with a covariance matrix, dense.

    ``tau`` holds the known prior precisions (NaN where a group's variance or covariance rules);
    ``ig_groups`` lists the coordinate blocks that share one variance with an IG(A, B) prior;
    ``iw_groups`` lists (m, q) index arrays whose rows are the levels of a term with covariance
    ``Sigma_k ~ IW(iw_df[k], iw_scale[k])``, so the prior precision has ``E[Sigma_k^{-1}]`` on
    each level's q x q block. Given ``E[1/a_i]``, ``E[1/sigma_k^2]`` and ``E[Sigma_k^{-1}]``, returns
    the updated q: ``mu, Sigma, chi, B_q`` and the IW parameters ``(df_q, Psi_q)`` of every term.
    """
    n, q = C.shape
    T = np.diag(np.nan_to_num(tau, nan=0.0))
    for k, g in enumerate(ig_groups):
        T[g, g] = mu_inv_sigma[k]
    for k, idx in enumerate(iw_groups):
        for row in idx:
            T[np.ix_(row, row)] = mu_inv_Sigma[k]
    Sigma = np.linalg.inv(C.T @ (mu_inv_a[:, None] * C) + T)
    mu = Sigma @ C.T @ ((1 + mu_inv_a) * y)
    chi = (1 - y * (C @ mu)) ** 2 + np.einsum("ij,jk,ik->i", C, Sigma, C)
    Bq = np.array([B + 0.5 * (mu[g] @ mu[g] + np.trace(Sigma[np.ix_(g, g)])) for g in ig_groups])
    iw = []
    for k, idx in enumerate(iw_groups):
        Psi = iw_scale[k] + sum(np.outer(mu[row], mu[row]) + Sigma[np.ix_(row, row)] for row in idx)
        iw.append((iw_df[k] + len(idx), Psi))
    return mu, Sigma, chi, Bq, iw
