"""Shared helpers of the test suite: paper oracles, statistical checks (KS with effective sample
sizes, SBC ranks), exact-posterior checks by quadrature, and small data generators."""
