"""Toy models for the engines' run-boundary tests: a VB model that never converges and a Gibbs
model that counts its sweeps and can fail, exit or send Ctrl-C on cue."""

import os
import signal
import time

import numpy as np


class SlowVB:
    """ELBO rising by 1 per sweep from -1e6: never converges at tol=1e-8, each sweep ~2 ms."""

    def vb_initial_state(self):
        return np.zeros(1)

    def vb_sweep(self, x):
        time.sleep(0.002)
        new = x + 1.0
        elbo = -1e6 + float(new[0])
        return new, {"elbo": elbo, "x": new.copy()}, elbo


class Counter:
    """Gibbs toy: theta counts sweeps; raises ``error`` at sweep ``fail_at`` (in the chain ``chain``);
    sweep ``sigint_at`` sends SIGINT to this process ``sigint_times`` times (as Ctrl-C)."""

    def __init__(self, fail_at=None, error=KeyboardInterrupt, chain_value=None, sigint_at=None, sigint_times=1):
        self.fail_at, self.error, self.chain_value = fail_at, error, chain_value
        self.sigint_at, self.sigint_times = sigint_at, sigint_times

    def gibbs_initial_state(self, rng):
        return {"theta": np.zeros(2), "first": rng.random()}

    def gibbs_sweep(self, state, rng):
        n = state["theta"][0] + 1
        if n == self.fail_at and (self.chain_value is None or state["first"] < self.chain_value):
            if self.error == "exit":
                os._exit(3)
            raise self.error("sweep failed") if self.error is not KeyboardInterrupt else KeyboardInterrupt
        if n == self.sigint_at:
            for _ in range(self.sigint_times):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler runs
        return {"theta": np.array([n, rng.random()]), "first": state["first"]}
