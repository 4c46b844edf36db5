"""Capstone: data, tensor and pipeline parallelism composed on one device mesh, and the planner."""
