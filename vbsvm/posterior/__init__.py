"""Posterior representations (draws, modes, Gaussian and spike-and-slab approximations), the
imputation posterior, and linear-response covariance corrections."""
