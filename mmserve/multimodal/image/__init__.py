"""One image: decode with size limits, per-family preparation (content hash, then the model's
image processor or its fast uint8 rewrite), the admission memo, anyres geometry and the image
text some families write into the prompt."""
