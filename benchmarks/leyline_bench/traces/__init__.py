"""Real agent sessions replayed on real engines (``leyline-bench traces``): the policies frameworks apply, the arms
each on its own server, the floor and cache breaks."""
