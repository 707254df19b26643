"""analysis: results (JSON/CSV) in, tidy DataFrames, tables and figures out. pandas and matplotlib only."""
