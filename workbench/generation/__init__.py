"""generation layer of workbench."""
