"""Benchmark layer: datasets, prompts, answer checkers, the code sandbox, result store and statistics."""
