"""Measures of a model: lm-eval evaluation and its harness, fidelity to the teacher, quality against prompt length, SimScore, the cut-off advisor and FLOPs."""
