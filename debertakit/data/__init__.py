"""Data: corpora, masking, packing, task readers and collators."""
