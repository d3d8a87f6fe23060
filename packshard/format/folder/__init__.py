"""Any command's output folder, guarded: contained paths, proven ownership, a safe claim.

``paths`` keeps every path a manifest names inside OUT; ``outdir`` says what an OUT may be
(never an input, replaced only when proven packshard's); ``claim`` locks, stages and publishes
OUT atomically.  Every command that writes a folder shares it.
"""
