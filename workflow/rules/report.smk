# Rules of the report stage (see the Snakefile index).
