"""Fit files: reading and writing a fit as bounded, checked data (HDF5 through xarray)."""
