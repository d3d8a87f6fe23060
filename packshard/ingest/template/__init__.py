"""The untrusted-template jail: load, compile and render chat templates within bounds.

``render`` loads a template (the tokenizer's, a file, or a built-in) and renders a
conversation; ``sandbox`` is the immutable Jinja sandbox with Hugging Face's conventions and
``{% generation %}`` recording; ``budget`` bounds what one render may cost (time, sizes, loop
steps) and checks the calls and filters that amplify their input.
"""
