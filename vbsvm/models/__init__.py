"""The models, each written out at the top of its module: the hinge augmentation, the linear SVM
(with random effects), Laplace-zero selection, missing predictors, the sparse-GP SVM, and the priors."""
