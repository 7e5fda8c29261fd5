"""Fitted models: the result classes (linear, selection, imputed, GP, Dask), their summaries,
plots, and the comparison of fits."""
