"""The model check: a tiny causal model run on packed rows and on each example alone.

``forward`` crops rows and runs the model's forwards (block-causal masks, reset positions);
``equivalence`` compares packed with alone, mutates a neighbour, and runs the naive control
that must be caught leaking.
"""
