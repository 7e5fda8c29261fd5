"""The formula stage: a formula and a data frame in, a :class:`~vbsvm.formula.design.Design` out
(fixed-effect matrix, random-effect terms, standardization), checked for safety and encodable as text."""
