"""Memories and their versions: reading the bank, and applying writer decisions as new versions."""
