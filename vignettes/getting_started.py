# %% [markdown]
# # Getting started: a random-intercept Bayesian SVM for the toenail trial
#
# **The question.** In a trial of two oral antifungal treatments (itraconazole and terbinafine),
# 294 patients with toenail dermatophyte onychomycosis were seen at up to 7 visits over a year
# (De Backer et al. 1998). At each of the 1908 visits the separation of the nail plate from the
# nail bed (onycholysis) was graded *none or mild* (`y = 0`) or *moderate or severe*
# (`y = 1`). Does onycholysis recede with time, faster under terbinafine, once we allow each
# patient their own baseline?
#
# **The model.** Luts & Ormerod (2014, Section 4.3) fit a support vector machine with a random
# intercept per patient. In R-style formula notation:
#
# ```
# y ~ time * terbinafine + (1 | patient_id)
# ```
#
# In words: the score of visit *j* of patient *i* is
# `f_ij = beta_0 + beta_1 time_ij + beta_2 terbinafine_i + beta_3 time_ij terbinafine_i + b_i`,
# with patient effects `b_i ~ N(0, sigma2_patient_id)`. A visit is classified as *moderate or
# severe* when `f_ij > 0`. The SVM's hinge loss enters as the pseudo-likelihood
# `exp(-2 max(0, 1 - y_ij f_ij))` (with `y` coded -1/+1), which Polson & Scott (2011) write as a
# mixture of normals, so the model can be fitted like a Bayesian GLMM. With `penalty=None` the
# fixed effects get the vague prior `N(0, 1e8)` (the paper's choice); `sigma2_patient_id` gets the
# inverse-gamma prior `IG(A_u, B_u) = IG(0.01, 0.01)` (a term with random slopes would get an
# inverse-Wishart prior on its covariance).
#
# We fit it twice: by the default fast approximation (`method="vb"`) and by Gibbs sampling
# (`method="gibbs"`, exact up to Monte Carlo error), and check that the two agree.
#
# Run this vignette as a script with `python vignettes/getting_started.py` (`--quick` for short
# chains) or render it with `python vignettes/render.py getting_started`. It writes the forest and
# trace plots to `figures/` and the comparison table to `results/` under `--out-dir` (default
# `vignettes/`; `_quick` appended in quick mode).

# %%
import argparse
import sys
import warnings
from pathlib import Path

HERE = Path.cwd() if "__file__" not in globals() else Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import arviz as az  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

import vbsvm  # noqa: E402
from _vignette import add_common_arguments, output_dirs, parse_args, show_figure  # noqa: E402

parser = argparse.ArgumentParser(description="Getting started: the toenail random-intercept SVM by VB and Gibbs.")
add_common_arguments(parser, quick_help="Gibbs 2 chains x 300 draws after 150 (seconds)")
parser.add_argument("--chains", type=int, default=4, help="Gibbs chains (default 4)")
parser.add_argument("--draws", type=int, default=None, help="Gibbs draws per chain (default 2000; quick 300)")
parser.add_argument("--tune", type=int, default=None, help="Gibbs tuning draws per chain (default 1000; quick 150)")
parser.add_argument("--seed", type=int, default=1)
args = parse_args(parser)
chains = 2 if args.quick else args.chains
draws = args.draws or (300 if args.quick else 2000)
tune = args.tune if args.tune is not None else (150 if args.quick else 1000)
FIGURES, RESULTS = output_dirs(args.out_dir)
SUFFIX = "_quick" if args.quick else ""
pd.set_option("display.width", 120)
print(f"Gibbs settings: {chains} chains x {draws} draws after {tune} tuning draws, seed {args.seed}")

# %% [markdown]
# ## The data
#
# The data ship with vbsvm. `time` is the month of the visit, `terbinafine` is 1 for the
# terbinafine arm and 0 for itraconazole.

# %%
toenail = vbsvm.datasets.load("toenail")
print(toenail.head(8).to_string(index=False))
print(f"\n{len(toenail)} visits of {toenail['patient_id'].nunique()} patients; "
      f"{int(toenail['y'].sum())} visits with moderate or severe onycholysis.")
print(pd.crosstab(toenail["visit"], toenail["treatment"], values=toenail["y"], aggfunc="mean")
      .round(3).rename_axis(index="visit", columns="P(y = 1)").to_string())

# %% [markdown]
# ## The fast fit
#
# `vbsvm.svm` takes the formula and the data frame. The default `method="vb"` is a calibrated
# approximation (expectation propagation integrated over a grid of the variance); it takes about
# a second here.

# %%
FORMULA = "y ~ time * terbinafine + (1 | patient_id)"
vb = vbsvm.svm(FORMULA, data=toenail, penalty=None, seed=args.seed)
print(vb.summary())

# %% [markdown]
# The table reads like a GLMM summary: posterior means, posterior sds and 95% intervals on the
# original scale of the predictors. The score falls with time in both arms (`time`); the
# interaction `time:terbinafine` is the extra slope under terbinafine. Its interval excludes 0
# when the fit agrees with the paper's finding that terbinafine clears onycholysis faster; the
# main effect `terbinafine` (the difference at month 0, when the arms were randomized) should
# straddle 0.
#
# `varcomp()` gives the variance of the patient intercepts. It is large compared with the fixed
# effects: patients differ a lot in their baseline, which is why the random intercept helps
# classification (see the `toenail` vignette).

# %%
print(vb.varcomp().round(3).to_string())

# %% [markdown]
# ## The exact reference: Gibbs sampling
#
# The same call with `method="gibbs"` runs the Gibbs sampler (several chains, with R-hat and
# effective sample sizes in the summary). vbsvm warns when R-hat > 1.01 or a bulk ESS is
# below 400; the chains below are long enough for the fixed effects in the full run.

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    gibbs = vbsvm.svm(FORMULA, data=toenail, penalty=None, method="gibbs", chains=chains, draws=draws,
                      tune=tune, seed=args.seed, progress=False)
print(gibbs.summary())
for w in caught:
    print(f"\nWarning ({type(w.message).__name__}): {str(w.message)[:400]}")

# %%
print(gibbs.varcomp().round(3).to_string())

# %% [markdown]
# ## Does the fast fit agree with Gibbs?
#
# `vbsvm.compare` puts the two posteriors side by side, Gibbs as the reference. `diff_sd` is the
# difference of the means in Gibbs sds, `sd_ratio` the ratio of the sds, and `accuracy` the
# overlap of the two marginal densities (100% = identical). An accuracy above 90% means the fast
# fit can stand in for the sampler for that parameter.

# %%
cmp = vbsvm.compare(vb, gibbs)
table = cmp.table()
print(table.round(4).to_string())
table.to_csv(RESULTS / f"getting_started_compare{SUFFIX}.csv")

# %% [markdown]
# For the four fixed effects the fast fit is close to Gibbs: means within a fraction of a Gibbs sd
# and similar sds. The patient variance `sigma2_patient_id` is its weak spot: the fast fit puts
# it lower and with a narrower posterior than Gibbs (negative `diff_sd`, `sd_ratio` below 1,
# lowest accuracy). For inference about the variance component, use Gibbs.

# %%
cmp.plot("forest")
show_figure(plt.gcf(), FIGURES / f"getting_started_forest{SUFFIX}.png")

# %% [markdown]
# The forest plot shows the fixed effects: 50% and 95% intervals under each fit.
#
# ## Predictions for new visits
#
# `predict(kind="prob")` gives `P(y = 1 | x, data)`, the probit predictive of the score's
# posterior (the SVM pseudo-likelihood is not itself a probability model; see the README).
# `kind="class"` thresholds the posterior mean score at 0. A patient not seen in training
# (a `patient_id` one above the largest here) gets a new random intercept integrated over its prior
# (`new_levels="integrate"`, the default), so its probabilities are pulled towards 1/2; a known
# patient's intercept is used (the first rows: patient 1 in their own arm).

# %%
known = int(toenail["patient_id"].iloc[0])
arm = int(toenail.loc[toenail["patient_id"] == known, "terbinafine"].iloc[0])
unseen = int(toenail["patient_id"].max()) + 1
new = pd.DataFrame({"patient_id": [known] * 3 + [unseen] * 6, "time": [0, 6, 12] * 3,
                    "terbinafine": [arm] * 3 + [0] * 3 + [1] * 3})
pred = new.assign(prob_vb=vb.predict(new, kind="prob"), prob_gibbs=gibbs.predict(new, kind="prob"),
                  class_vb=vb.predict(new), class_gibbs=gibbs.predict(new))
print(pred.round(3).to_string(index=False))

# %% [markdown]
# ## ArviZ
#
# `to_arviz()` returns the posterior as an `xarray.DataTree` in the ArviZ 1.x layout (groups
# `posterior`, `sample_stats`, `log_likelihood`, `observed_data`, ...), so every ArviZ summary
# and plot applies. Here the trace plot of the Gibbs chains for the fixed effects and the patient
# variance, one row per parameter (density by chain on the left, draws on the right): the chains
# should overlap and look like stationary noise.
#
# `az.summary` reports ArviZ's default 89% equal-tailed intervals (`eti89`), next to the bulk and
# tail ESS, R-hat and the Monte Carlo standard errors.

# %%
idata = gibbs.to_arviz()
print(az.summary(idata, var_names=["beta", "sigma2_patient_id"]).round(3).to_string())

# %%
az.plot_trace_dist(idata, var_names=["beta", "sigma2_patient_id"], compact=False, backend="matplotlib")
show_figure(plt.gcf(), FIGURES / f"getting_started_trace{SUFFIX}.png")

# %% [markdown]
# ## What next
#
# * `toenail`: the paper's classification experiment on this model (100 random splits).
# * `spam_selection`: variable selection with the Laplace-zero prior.
# * `acath_missing`: missing predictors imputed inside the model.
# * `gp_raetsch`, `gp_autotune`: the nonlinear (Gaussian process) SVM.
