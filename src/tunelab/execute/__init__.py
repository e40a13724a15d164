"""Running commands: launchers, the study runner, MPI command lines."""
