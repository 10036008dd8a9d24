"""``make gpu-check`` and ``make gpu-wheels``: one prepared script for a lent GPU machine and the wheels its image
lacks."""
