"""Label: which characters of a rendered conversation are trained.

One entry, :func:`~packshard.ingest.label.spans.render_examples`: it renders one record as its
examples and picks the trained messages (loss policy, per-message flags, ``--turns``); the
tiers of :mod:`~packshard.ingest.label.tiers` (its table is the one) choose their characters.
It is a table, not a chain: ``spans`` imports ``tiers``, ``tiers`` imports every other module,
and those import only ``chat`` (the leaf: the conversation, its frame's type, shared text
helpers) and the template.  What a tier needs of the template (frame, reasoning field) is
passed in by ``tiers``.  Every module, in the order a record meets them::

    spans      render the record (template), choose the trained messages     render_examples
    reasoning  what reasoning the template is given; rendered blocks found   template_messages
    chat       the rendered conversation the tiers read, built by keyword     Chat
    frame      the template's assistant header and end markers, cached once  template_frame
    tiers      the tier table; tiers 1 (tags) and 2 (search); policies       label_chat
    probe      tier 3: a second render with stand-ins                        probe_anchors
    prefix     tier 4: what rendering a turn adds to the conversation        prefix_turn
"""
