"""Standard Agents runtime for Python."""
