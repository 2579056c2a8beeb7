"""Dataset recipes for WER runs, and the draft-distillation recipe."""
