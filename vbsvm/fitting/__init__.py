"""Fitting: the public entry points (:func:`~vbsvm.fitting.svm.svm`, :func:`~vbsvm.fitting.gp.gpsvm`,
:func:`~vbsvm.fitting.svm.load`), the settings of a fit (:func:`~vbsvm.fitting.svm.fit_settings`, a
:class:`~vbsvm.settings.FitSettings`), and one builder per model that joins a model, an
engine and a result class."""
