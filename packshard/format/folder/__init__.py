"""Any command's output folder, guarded: contained paths, proven ownership, a safe claim.

``paths`` keeps every path a manifest names inside OUT (regular files only); ``outdir`` says
what an OUT may be (never an input, replaced only when a schema-valid manifest whose dataset id
matches its files proves packshard wrote it); ``claim`` locks OUT without following links,
names the temporary folders, publishes atomically and rolls back an interrupted replace.
``pack`` and ``export`` share it, as will any command that writes a folder.
"""
