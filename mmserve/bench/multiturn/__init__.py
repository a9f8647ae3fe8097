"""``bench multiturn``: one chat adding an image per turn, per engine and round."""
