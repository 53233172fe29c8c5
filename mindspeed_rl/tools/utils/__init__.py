"""Helpers of the agent tools: the tool registry, the tool-call parser, truncation, limits."""
