"""Lightning training of the ISQ codebook: ``python -m training.fit --config configs/<name>.yaml``."""
