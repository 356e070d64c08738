"""Files, documents and reports: what every layer above reads and writes."""
