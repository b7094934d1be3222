"""Values and rules with no I/O: ids, JSON codec, messages and outcomes, what the store
accepts, the indexed text of a message. Imports no SQLAlchemy.
"""
