"""Tokens: rendered text to token ids and labels.

``tokenizer`` loads a tokenizer offline with the adjustments that match ``transformers``;
``labels`` encodes in batches and turns trained character spans into labels; ``aligner`` and
``alignment`` find every token's place in the text from the ids alone (no offsets).
"""
