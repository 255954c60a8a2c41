"""Using a written engine: text generation and an OpenAI-compatible server over it."""
