"""Using a checkpoint interactively: streamed code completion with HumanEval's prompt format and stop rules, or
infilling between a prompt and a suffix (`completion.py`), and per-token surprise of a source file rendered as
HTML (`highlight.py`).

Takes in: a repository reference + revision (loaded with `codeparrot.repository.model`). Gives out: text on
the terminal, JSON samples, an HTML page.
"""
