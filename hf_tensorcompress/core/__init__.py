"""What every method uses and checkpoints do not ship: the method registry, target resolution (the family table),
rank arithmetic, the export of a model's shipped code, and size/cost metrics; and the package's plumbing, leaf
modules below the configs: the configs' JSON round trip, progress bars, lazy exports, optional extras, and the
filter for third-party log lines."""
