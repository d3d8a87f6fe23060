"""Label: which characters of a rendered conversation are trained.

``spans`` renders one record as its examples and picks the trained messages (loss policy,
per-message flags, ``--turns``); ``chat`` chooses their characters in four named tiers, the
first that places every trained turn wins::

    1 tags    {% generation %} blocks decide exactly        (chat.generation_blocks)
    2 search  each piece found once, in order, in one turn  (turns.search_anchors, and
              turns.plain_turns for a conversation of plain role/content messages)
    3 probe   a second render with stand-ins                (probe.probe_anchors)
    4 prefix  render messages[:i] + prompt vs messages[:i+1] (locate.prefix_turn)

On the shared chat data search places 5,384 of 5,412 records in one render and the probe the
28 tool-calling ones; the prefix tier alone reproduces the same labels on every record in 2–6
renders a record.  ``frame`` finds a template's assistant header and end markers (and holds
the per-conversation context, ``Chat``); ``reasoning`` gives reasoning to the template and
finds rendered blocks.
"""
