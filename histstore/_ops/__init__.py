"""The programs a store runs, one family per module: history, whole-conversation state,
lists, listing, leases and turn status, settling lost commits, search, semantic search,
editing.
"""
