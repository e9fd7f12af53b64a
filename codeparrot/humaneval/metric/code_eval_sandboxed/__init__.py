"""The sandboxed code_eval metric: `evaluate.load(codeparrot.humaneval.pass_at_k.METRIC_DIR)`."""
