"""Shared network layers that more than one family or released architecture can build on."""
