"""Prompts and reference answers: the arithmetic task, dataset loaders, templates, ordered sources."""
