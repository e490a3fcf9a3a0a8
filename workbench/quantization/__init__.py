"""quantization layer of workbench."""
