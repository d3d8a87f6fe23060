"""Images in chat records: found, sized from their headers, counted, expanded.

A vision-language record names its images (LLaMA-Factory ``images`` with ``<image>``
placeholders, content parts, LLaVA ``image``); ``parts`` reads them into content parts and
:class:`~packshard.ingest.types.MediaFile` values, ``files`` finds each file and reads its
size from the header alone (never the pixels), ``grid`` turns a size into the vision encoder's
patch grid by the model family's resize rule (:class:`~packshard.options.VisionRule`), and
``expand`` writes one placeholder token per merged patch into the rendered text.  The 3-D
positions the model computes from them are the reader's (:mod:`packshard.torch.vision.rope`).
"""
