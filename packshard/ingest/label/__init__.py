"""Label: which characters of a rendered conversation are trained.

``spans`` renders one record as its examples and picks the trained messages (loss policy,
per-message flags, ``--turns``); ``chat`` chooses their characters; ``turns``, ``probe`` and
``locate`` find where each trained turn sits; ``frame`` finds a template's assistant header
and end markers; ``reasoning`` gives reasoning to the template and finds rendered blocks.
"""
