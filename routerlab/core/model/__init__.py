"""A loaded base model and its anatomy: loading (embedded GGUF, hub id, folder), the one place that knows Hugging Face module paths (Anatomy), KV caches and a batch's cache slots."""
