"""Inference engines that drive a model: coordinate-ascent VB, expectation propagation (with
the variance integration and its Laplace-zero form), Gibbs chains, posterior modes, SVI, and pooled
fits over imputed completions; :mod:`~vbsvm.inference.dispatch` maps a method to an engine."""
