"""Test helpers, imported as ``tests.helpers.<module>`` (the repository root is on ``sys.path`` under
pytest because ``tests`` is a package): a fake language model, (p, q) families with goodness-of-fit
tests, and tiny random Hugging Face models."""
