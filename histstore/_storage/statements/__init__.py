"""The compiled SQL: every statement the programs run, and the one place that reads
``dialect.name`` (``dialects``).
"""
