"""Kernel toolchains: one module per backend."""
