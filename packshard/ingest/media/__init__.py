"""Images in chat records: found, sized from their headers, counted, expanded.

``parts`` reads a record's images into content parts and
:class:`~packshard.ingest.types.MediaFile` values, ``files`` sizes each from its header,
``grid`` turns a size into the patch grid (:class:`~packshard.options.VisionRule`), ``expand``
writes one placeholder token per merged patch into the rendered text.
"""
