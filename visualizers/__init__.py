"""Textual widgets that draw a lesson model's state. No torch, no I/O."""
