"""The gate's stages, one module each; their order is worker/gate.py's STAGES."""
