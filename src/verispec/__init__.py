"""verispec: speculative decoding with lossless and lossy verification, and diagnostics.

Layers (imports only go downwards): ``sampling`` and ``rules`` (pure tensor maths) <- ``models``
(backends) <- ``engine`` (decoding loops) <- ``bench`` / ``diagnose`` <- ``cli``.
"""

__version__ = "0.1.0"
