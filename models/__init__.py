"""Bringing a model in: a llama.cpp GGUF as a Hugging Face folder the engines read."""
