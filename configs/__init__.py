"""ml-collections experiment configs: `python -m launch.train --config configs/X.py[:arg]`."""
