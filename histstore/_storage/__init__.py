"""Everything between the store and the database: engine and URL handling, the tables and
migrations, the executor with its drivers and connections, and database errors.
"""
