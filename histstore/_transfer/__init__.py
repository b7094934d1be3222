"""Moving whole conversations: the export format, reading a store page by page, writing and
syncing incoming conversations, and export, import and copy on top.
"""
