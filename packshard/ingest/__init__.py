"""Read → normalize → render → tokenize → label: the stages every command that needs tokens runs.

``sources`` and ``streams`` read files; ``normalize`` turns every record format into one
conversation (``messages`` reads message lists, ``pairs`` preference pairs and KTO records);
``sandbox``, ``templates`` and ``spans`` render it and choose the characters to train;
``tokenizer``, ``labels`` and ``alignment`` turn those into token ids and labels; ``chunks``
drives them over the inputs, a chunk of records at a time.
"""
