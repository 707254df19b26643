"""Inputs: ShareGPT conversations, packed training rows, BIG-bench tasks, the held-out split, the embedded assets and the variants sheet."""
