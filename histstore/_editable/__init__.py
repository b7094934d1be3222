"""The editable conversation as a pure value: entries, change records, the state a change
folds into, splice planning, and rebuilding a stored change log. No I/O.
"""
