"""Task specifications and the packaged task suite."""
