"""models layer of workbench."""
