"""What every method uses and checkpoints do not ship: the method registry, target resolution (the family table),
rank arithmetic, the export of a model's shipped code, and size/cost metrics."""
