"""What every method uses: the method registry, the layer contract, target resolution (the family table),
checkpoint export and loading (the transformers quantizer integration), and size/cost metrics."""
