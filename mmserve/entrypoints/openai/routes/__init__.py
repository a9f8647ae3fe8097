"""The other routes: /tokenize and /detokenize, and the playground page."""
