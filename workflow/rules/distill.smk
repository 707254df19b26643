# Rules of the distill stage (see the Snakefile index).
