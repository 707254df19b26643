# Rules of the serve stage (see the Snakefile index).
