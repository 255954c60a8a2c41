"""Kernel compilation and tuning before a study: the warm-up and the kernel knob search."""
