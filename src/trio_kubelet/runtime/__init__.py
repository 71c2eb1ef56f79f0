"""Container runtime (CRI) access: generated messages, trio client, fake runtime."""
