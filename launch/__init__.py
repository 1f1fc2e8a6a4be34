"""Kernels and their launch: tile plan, workspace layout, CuTe DSL kernels, compile cache."""
