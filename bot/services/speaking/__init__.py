"""Services that speak: the outbox, prompts, people and their languages, the audit log, NVML
words."""
