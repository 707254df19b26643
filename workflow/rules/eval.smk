# Rules of the eval stage (see the Snakefile index).
