"""Plan: which examples share a row, from their lengths alone.

``planner`` holds the numba planners (best-fit and first-fit decreasing, wrapped) and their
pure-Python twins; ``rows`` turns a plan into :class:`~packshard.pack.plan.rows.RowPlan`, the
one plan type (parts, example ids, the seeded row shuffle).
"""
