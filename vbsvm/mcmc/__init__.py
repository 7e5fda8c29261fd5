"""Markov chain Monte Carlo kernels that the models build their Gibbs sweeps from: slice sampling,
HMC, independence proposals, block tuners, partial non-centring and model jumps."""
