"""Integrations at the edge of verispec: thin adapters to other engines and harnesses (vLLM, lm-evaluation-harness).

Each one imports its engine lazily, so ``import verispec`` never needs one installed.
"""
