"""Images in chat records: found, sized from their headers, counted, expanded, positioned.

A vision-language record names its images (LLaMA-Factory ``images`` with ``<image>``
placeholders, content parts, LLaVA ``image``); ``parts`` reads them into content parts and
:class:`~packshard.ingest.media.files.MediaFile` values, ``files`` finds each file and reads its
size from the header alone (never the pixels), ``grid`` turns a size into the vision encoder's
patch grid by the model family's resize rule, ``expand`` writes one placeholder token per
merged patch into the rendered text, and ``rope`` gives the 3-D rotary positions the model
computes for the example alone.
"""
