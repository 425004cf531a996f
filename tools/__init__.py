"""Command-line tools: thin argument parsing over library calls."""
