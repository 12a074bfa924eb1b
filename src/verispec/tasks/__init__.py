"""The problems and their checking, below both the bench and the diagnostics: offline datasets
(:mod:`~verispec.tasks.datasets`), prompt templates (:mod:`~verispec.tasks.prompts`), answer checkers
(:mod:`~verispec.tasks.checkers`) and the sandbox graded code runs in (:mod:`~verispec.tasks.sandbox`)."""
