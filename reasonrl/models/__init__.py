"""Model resolution and loading: the built-in SmolLM2, HF directories, GGUF files, hub ids, tiny-random."""
