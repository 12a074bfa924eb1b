"""verispec: speculative decoding with lossless and lossy verification, and diagnostics.

Layers (imports only go downwards, each testable alone):

``params`` / ``settings`` <- ``sets`` / ``topk`` <- ``sampling`` <- ``rules`` (pure tensor maths)
<- ``models`` (backends) <- ``engine`` (decoding loops) <- ``diagnose`` <- ``bench`` <- ``flags`` /
``*.cli`` <- ``cli``.  ``bench.datasets`` / ``prompts`` / ``checkers`` / ``sandbox`` are a data layer
that ``diagnose`` may use too.
"""

__version__ = "0.1.0"
