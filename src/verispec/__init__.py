"""verispec: speculative decoding with lossless and lossy verification, and diagnostics.

Layers (imports only go downwards, each testable alone; ``tests/test_imports.py`` checks it, imports
inside functions included):

plain helpers (``params``, ``settings``, ``sets``, ``topk``, ``sampling``, ...) <- ``rules`` (pure tensor
maths) <- ``models`` (backends) <- ``engine`` (decoding loops) <- ``tasks`` (datasets, prompts, checkers,
the sandbox) <- ``diagnose`` <- ``bench`` <- the edge: ``cli``, ``flags``, ``serve``, ``integrations``.
"""

__version__ = "0.1.0"
