"""Isolated code execution: Docker and bubblewrap sandboxes with a persistent Python worker."""
