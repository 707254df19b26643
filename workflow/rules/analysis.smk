# Rules of the analysis stage (see the Snakefile index).
