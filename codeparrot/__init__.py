"""CodeParrot: a reproducible recipe for pretraining GPT-2 code models on GitHub Python files."""

__version__ = "0.1.0"
