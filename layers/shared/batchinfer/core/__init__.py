"""Infrastructure every layer uses: settings, observability, AWS clients, identifiers, fault injection.

Imports nothing else of batchinfer."""
