"""Moving whole conversations and LangGraph threads: the export format, reading a store
page by page, writing and syncing incoming conversations, the same for threads
(``threads``: their rows, reading, writing, and their part of export, import and copy),
and export, import and copy on top.
"""
