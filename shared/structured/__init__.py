"""Constrained decoding (lifecycle steps 2 and 11): specs become llguidance grammars.

The API layer validates a spec (grammar.py) before a request is queued; the engine core compiles
it off the step loop (compiler.py), keeps one matcher per sequence, and the sampler masks each
step's logits with the matchers' token bitmasks (bitmask.py).
"""
