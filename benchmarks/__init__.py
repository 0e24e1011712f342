"""`make bench`: batchinfer measured against the physical limits it runs into, side by side."""
