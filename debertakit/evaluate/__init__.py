"""Evaluation: task metrics (`metrics`), SQuAD scoring and post-processing (`squad`), multi-seed summaries and
significance tests (`significance`)."""
