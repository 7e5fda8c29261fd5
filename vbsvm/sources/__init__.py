"""Data sources beyond one in-memory frame: Dask DataFrames (design learning, blocks on the
workers, lazy predictions, minibatches)."""
